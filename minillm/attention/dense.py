"""No KV cache: every sequence attends causally over exactly the tokens given in this pass.

This is chapter 1's first loop: each step recomputes the whole sequence, so nothing is stored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseAttention:
    """Causal attention within each sequence of a flat batch; stores nothing."""

    def __init__(self, query_lens: list[int]):
        self.query_lens = query_lens  # tokens of sequence i are the next query_lens[i] rows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        outputs = []
        for qs, ks, vs in zip(q.split(self.query_lens), k.split(self.query_lens), v.split(self.query_lens)):
            # (1, heads, len, head_dim) for scaled_dot_product_attention
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
                is_causal=True, scale=scale, enable_gqa=True,
            )
            outputs.append(o[0].transpose(0, 1))  # (len, heads, head_dim)
        return torch.cat(outputs)
