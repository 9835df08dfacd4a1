"""The decode step a graph records: tensors in, logits out, the same shapes every time.

Everything that varies from step to step is *data* in the static buffers (which token, which
position, which slot, which blocks, how long each context is); nothing the step does depends on
those values in Python. So there is no `.item()`, no `.tolist()`, no `if` on a tensor, no shape
computed from data: the reference decode attention of `minillm/attention/paged_ops.py` asks the
GPU for the longest context (`int(context_lens.max())`) to size its gather — a host sync, and a
shape that changes — so the recorded step masks instead:

    keys of row i:  every block of its table (the full width, pad blocks included)
    visible:        key position < context_lens[i]        (the rest: -inf before the softmax)

The kernels — Triton's on a GPU, the C one on a CPU (minillm/attention/cpu_paged.py) — read
`context_lens` themselves and stop there: with them (`ops`, the cache's own), the recorded step reads
no more than an eager one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.attention import paged_ops
from minillm.attention.kv_codes import dequantize, is_quantized
from minillm.model.decoder import CausalLM


class StaticPagedDecode:
    """The attention backend of a recorded decode step: one new token per row, shapes fixed by
    the buffers. Stores each row's K/V through `slot_mapping`, then attends through `block_tables`
    (with `ops`, the paged operations module: torch or Triton)."""

    def __init__(self, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], slot_mapping: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, ops=paged_ops,
                 k_scale: list[torch.Tensor] | None = None, v_scale: list[torch.Tensor] | None = None):
        self.k_cache, self.v_cache, self.ops = k_cache, v_cache, ops
        self.k_scale, self.v_scale = k_scale, v_scale  # an int8 cache's scales (chapter 12)
        self.slot_mapping, self.block_tables, self.context_lens = slot_mapping, block_tables, context_lens
        if ops is paged_ops:  # computed once per step, used by every layer
            rows, width = block_tables.shape
            block_size = k_cache[0].shape[1]
            key_positions = torch.arange(width * block_size, device=context_lens.device)
            self.visible = (key_positions[None, :] < context_lens[:, None])[:, None, None]  # (rows, 1, 1, keys)
            self.blocks = block_tables.reshape(-1)  # (rows * width,)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q: (rows, heads, head_dim); k, v: (rows, kv_heads, head_dim) -> (rows, heads, head_dim)."""
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        scales = {} if self.k_scale is None else {"k_scale": self.k_scale[layer], "v_scale": self.v_scale[layer]}
        self.ops.store_kv(k, v, k_cache, v_cache, self.slot_mapping, **scales)
        if self.ops is not paged_ops:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, self.block_tables, self.context_lens, scale)
        rows, heads, head_dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        keys_per_row = self.block_tables.shape[1] * block_size
        # (rows, width * block_size, kv_heads, head_dim): each row's blocks, whole (index_select: fast on CPU)
        keys = k_cache.index_select(0, self.blocks).view(rows, keys_per_row, kv_heads, head_dim)
        values = v_cache.index_select(0, self.blocks).view(rows, keys_per_row, kv_heads, head_dim)
        if is_quantized(k_cache):  # codes: read back as the model's floats
            keys, values = (dequantize(codes, None if not scales else scales[name].index_select(0, self.blocks).view(
                rows, keys_per_row, kv_heads), q.dtype) for codes, name in ((keys, "k_scale"), (values, "v_scale")))
        queries = q.view(rows, kv_heads, heads // kv_heads, head_dim)  # GQA: a KV head's query heads as rows
        out = F.scaled_dot_product_attention(queries, keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=self.visible, scale=scale)  # (rows, kv_heads, group, dim)
        return out.reshape(rows, heads, head_dim)


def decode_step(model: CausalLM, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], input_ids: torch.Tensor,
                positions: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                context_lens: torch.Tensor, ops=paged_ops, k_scale: list[torch.Tensor] | None = None,
                v_scale: list[torch.Tensor] | None = None) -> torch.Tensor:
    """One decode token per row through the whole model: (rows,) ... -> (rows, vocab) float32 logits.
    Writes each row's K/V into the cache; rows of padding write only into the pad block."""
    backend = StaticPagedDecode(k_cache, v_cache, slot_mapping, block_tables, context_lens, ops, k_scale, v_scale)
    hidden = model(input_ids, positions, backend)  # (rows, hidden)
    return model.logits(hidden)
