"""Which slice of each weight one rank of a tensor-parallel group holds (Megatron-LM's split).

In every decoder block, the first matmul of a pair is split by its *outputs* (column-parallel) and
the second by its *inputs* (row-parallel), so nothing needs to be exchanged between them:

    attention:  x ─► qkv_proj[rank's heads] ─► attend (own heads) ─► o_proj[:, rank's heads] ─► partial sum
    MLP:        x ─► gate_up_proj[rank's rows] ─► silu(gate) * up ─► down_proj[:, rank's rows] ─► partial sum
                                                                          all-reduce (sum) ─┘ one per pair

The attention heads split evenly; when there are fewer KV heads than ranks, each KV head is
replicated on the ranks whose query heads read it (rank r holds KV head r x num_kv_heads / size).
The vocabulary (the embedding and the LM head) splits into equal row ranges, the last one padded
with zero rows. A row-parallel layer's bias is added once: rank 0 holds it.

Everything here is integers and slicing: a weight comes in whole (a tensor) or lazily (a
safetensors slice, so a rank reads only its own part of the file) and leaves as this rank's piece.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from minillm.model.config import ModelConfig

COLUMN_PARALLEL = ("qkv_proj", "gate_up_proj")  # split by output rows
ROW_PARALLEL = ("o_proj", "down_proj")  # split by input columns; their outputs are partial sums
VOCAB_PARALLEL = ("embed_tokens", "lm_head")  # split by vocabulary rows


def check_shardable(config: ModelConfig, size: int, quantization: str | None = None, group_size: int = 64) -> None:
    """A ValueError naming what does not divide, for a model `size` ranks cannot share evenly — or, with int4
    `quantization`, whose rank's shard cannot be cut into groups of `group_size` inputs."""
    if size == 1:
        return
    if config.num_heads % size:
        raise ValueError(f"tensor_parallel_size={size} must divide the model's {config.num_heads} attention heads")
    if config.num_kv_heads % size and size % config.num_kv_heads:
        raise ValueError(f"tensor_parallel_size={size} and the model's {config.num_kv_heads} KV heads: one must "
                         "divide the other (fewer KV heads than ranks are replicated)")
    if config.intermediate_size % size:
        raise ValueError(f"tensor_parallel_size={size} must divide the MLP's {config.intermediate_size} rows")
    if quantization == "int4":  # each rank quantizes its shard: a row-parallel layer's groups run along its columns
        for layer, inputs in (("qkv_proj", config.hidden_size), ("o_proj", config.q_size // size),
                              ("down_proj", config.intermediate_size // size)):
            if inputs % group_size:
                raise ValueError(f"quantization_group_size={group_size} must divide the {inputs} inputs each of the "
                                 f"{size} ranks holds of {layer} (int4 quantizes each rank's shard in groups)")


@dataclasses.dataclass(frozen=True)
class TensorShard:
    """Rank `rank` of `size`: which heads, MLP rows and vocabulary rows it holds."""

    rank: int
    size: int

    def q_heads(self, config: ModelConfig) -> range:
        per = config.num_heads // self.size
        return range(self.rank * per, (self.rank + 1) * per)

    def kv_heads(self, config: ModelConfig) -> range:
        """Its KV heads: its share, or the one its query heads read when they are replicated."""
        if config.num_kv_heads >= self.size:
            per = config.num_kv_heads // self.size
            return range(self.rank * per, (self.rank + 1) * per)
        head = self.rank * config.num_kv_heads // self.size
        return range(head, head + 1)

    def mlp_rows(self, config: ModelConfig) -> range:
        per = config.intermediate_size // self.size
        return range(self.rank * per, (self.rank + 1) * per)

    def vocab_rows(self, config: ModelConfig) -> range:
        """Its vocabulary rows, [start, start + per_rank); the last rank's may run past the vocabulary (padding)."""
        per = -(-config.vocab_size // self.size)
        return range(self.rank * per, (self.rank + 1) * per)

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The shapes this rank's layers have: its heads, MLP rows and vocabulary rows (the rest is the model's)."""
        if self.size == 1:
            return config
        return dataclasses.replace(config, num_heads=len(self.q_heads(config)), num_kv_heads=len(self.kv_heads(config)),
                                   intermediate_size=len(self.mlp_rows(config)),
                                   vocab_size=len(self.vocab_rows(config)))

    def holds(self, name: str) -> bool:
        """Whether this rank holds the parameter `name` (a row-parallel bias lives on rank 0 only)."""
        return not (_layer(name) in ROW_PARALLEL and name.endswith(".bias") and self.rank != 0)

    def shard(self, name: str, whole: Any, config: ModelConfig) -> torch.Tensor:
        """This rank's piece of the parameter `name` (minillm's names); `whole` is a tensor or anything that
        slices like one (`[a:b]`, `[:, a:b]`; safetensors' `get_slice`)."""
        layer = _layer(name)
        if self.size == 1 or layer not in COLUMN_PARALLEL + ROW_PARALLEL + VOCAB_PARALLEL:
            return whole[:]  # norms: every rank holds all of it
        if layer == "qkv_proj":  # rows: q of its heads, then k and v of its KV heads
            d, q_size, kv_size = config.head_dim, config.q_size, config.kv_size
            heads, kv = self.q_heads(config), self.kv_heads(config)
            return torch.cat([whole[heads.start * d : heads.stop * d],
                              whole[q_size + kv.start * d : q_size + kv.stop * d],
                              whole[q_size + kv_size + kv.start * d : q_size + kv_size + kv.stop * d]])
        if layer == "gate_up_proj":  # rows: its part of gate, then the same part of up
            rows, inter = self.mlp_rows(config), config.intermediate_size
            return torch.cat([whole[rows.start : rows.stop], whole[inter + rows.start : inter + rows.stop]])
        if layer in ROW_PARALLEL:
            if name.endswith(".bias"):
                return whole[:]  # rank 0's (`holds`)
            cols = self.q_heads(config) if layer == "o_proj" else self.mlp_rows(config)
            width = config.head_dim if layer == "o_proj" else 1
            return whole[:, cols.start * width : cols.stop * width]
        rows = self.vocab_rows(config)  # the vocabulary: its rows, zeros past the end
        piece = whole[rows.start : min(rows.stop, config.vocab_size)]
        if piece.shape[0] < len(rows):
            padding = piece.new_zeros((len(rows) - piece.shape[0], *piece.shape[1:]))
            piece = torch.cat([piece, padding])
        return piece


def _layer(name: str) -> str:
    """"layers.3.self_attn.qkv_proj.weight" -> "qkv_proj"; "embed_tokens.weight" -> "embed_tokens"."""
    parts = name.split(".")
    return parts[-2] if len(parts) >= 2 else name
