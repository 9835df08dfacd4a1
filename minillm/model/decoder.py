"""The decoder: embeddings, N × (attention + MLP) with pre-norm residuals, final norm, LM head.

The batch is *flat*: the tokens of all sequences are concatenated into one (num_tokens,) vector
with their positions beside them; the attention backend knows where each sequence starts.

Under tensor parallelism (chapter 13) the same classes hold one rank's shard: built with a
`communicator`, the layers take this rank's heads, MLP rows and vocabulary rows
(minillm/distributed/sharding.py), and the model exchanges partial results three ways — an
all-reduce after the embedding and after each row-parallel layer, and a gather of the logits' columns
to rank 0. Without one (the usual case) nothing of that is built or run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minillm.attention.backend import AttentionBackend
from minillm.model.attention import SelfAttention
from minillm.model.config import ModelConfig
from minillm.model.layers import GatedMLP, RMSNorm
from minillm.model.linear import Linear, linear
from minillm.model.rope import RotaryEmbedding, Rotation
from minillm.model.vocab_parallel import VocabParallelEmbedding

if TYPE_CHECKING:
    from minillm.distributed.communicator import Communicator


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, communicator: Communicator | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, layer_index, communicator)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, communicator)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rotation: Rotation,
                backend: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """The pre-norm block, residual = residual + attn(norm(.)), then + mlp(norm(.)), with each add done
        by the norm after it: x is the last block's output not yet added (the embeddings, with residual
        None, in the first layer). Returns (this block's MLP output, the residual stream before it)."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_and_norm(x, residual)  # residual += x; h = norm(residual)
        attended = self.self_attn(h, rotation, backend)
        h, residual = self.post_attention_layernorm.add_and_norm(attended, residual)
        return self.mlp(h), residual


class CausalLM(nn.Module):
    """(input_ids, positions, attention backend) -> hidden states; `logits()` applies the LM head.

    `config` is the whole model's; `shard_config` the shapes this process's layers hold (the same
    without tensor parallelism; with it, one rank's heads, MLP rows and vocabulary rows)."""

    def __init__(self, config: ModelConfig, communicator: Communicator | None = None):
        super().__init__()
        self.config = config
        self.communicator = communicator
        if communicator is None:
            self.shard_config = config
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        else:
            from minillm.distributed.sharding import TensorShard

            shard = TensorShard(communicator.rank, communicator.size)
            self.shard_config = shard.local_config(config)
            self.embed_tokens = VocabParallelEmbedding(shard.vocab_rows(config), config.hidden_size, communicator)
        local = self.shard_config
        self.layers = nn.ModuleList(DecoderLayer(local, i, communicator) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(config)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(config.hidden_size, local.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: (num_tokens,) -> hidden states (num_tokens, hidden)."""
        x = self.embed_tokens(input_ids)
        rotation = self.rope.at(positions, x.dtype)  # the same for every layer
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rotation, backend)
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm.add_and_norm(x, residual)[0]  # the last block's add, then the final norm

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """(n, hidden) -> (n, vocab) float32 logits; call it only on the rows that need them. Under tensor
        parallelism every rank computes its vocabulary's columns and rank 0 gets them all (the others None)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = linear(hidden, weight, None, self).float()  # (n, vocab), or (n, this rank's vocabulary rows)
        if self.communicator is None:
            return logits
        gathered = self.communicator.gather_columns(logits)  # (n, padded vocab) on rank 0
        return gathered[:, : self.config.vocab_size] if gathered is not None else None
