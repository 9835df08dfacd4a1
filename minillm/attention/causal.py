"""Causal attention of one sequence's new tokens, without computing the scores a mask would discard.

    keys:   | cached before this pass (start) | the new tokens (n) |
    new token j, at position start + j, sees keys 0 .. start + j

    scores, n queries x (start + n) keys:        ┌──────────────┬──────┐
                                                 │  the prefix  │ ◣    │  ◣: the new tokens' own
                                                 │  rectangle   │ ◣◣   │     causal triangle; the
                                                 │  (all seen)  │ ◣◣◣  │     blank corner above it
                                                 └──────────────┴──────┘     is masked

A fresh prefill (start = 0) is the triangle alone: one call with `is_causal`, whose kernels skip
the masked tiles instead of computing them (half of the scores of a long prompt). An extend (a
prefill chunk on top of earlier chunks, a prefix-cache hit, speculative guesses) is the rectangle
plus the triangle: each is attended on its own and the two results are merged with their
log-sum-exps, the way FlashAttention merges tiles. Where the score matrix is small (a few guesses,
a short chunk on a short context) the two calls and the merge cost more than the masked corner
wastes, and one masked call stays: `SPLIT_FROM` says where the line is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

# Split an extend when its score matrix has at least this many entries per head, n x (start + n).
# Below it, a second attention call and the merge cost more than the masked work they save, whatever
# the corner's share: benchmarks/causal_split.py measures both paths (on a 2-core CPU, the split pays
# from some 30-130 thousand scores; this line loses at most ~15% either side of it).
SPLIT_FROM = 65536


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                     scale: float) -> torch.Tensor:
    """q: (1, heads, n, head_dim), the new tokens at positions start...; keys, values:
    (1, kv_heads, start + n, head_dim), the cached tokens then the new ones (GQA: heads is a
    multiple of kv_heads). Returns (1, heads, n, head_dim)."""
    n, end = q.shape[2], keys.shape[2]
    if start == 0:  # a fresh prefill: the triangle only
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=True)
    if n * end < SPLIT_FROM:  # a small extend: mask it in one call
        visible = torch.ones(n, end, dtype=torch.bool, device=q.device).tril(diagonal=start)  # (n, end)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale, enable_gqa=True)
    if q.device.type != "cpu":  # GPU kernels take a causal mask aligned to the last key and skip its corner
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=causal_lower_right(n, end), scale=scale,
                                              enable_gqa=True)
    return _split_extend(q, keys, values, start, scale)


def _split_extend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                  scale: float) -> torch.Tensor:
    """The rectangle and the triangle attended apart (CPU flash kernel, which returns the
    log-sum-exp of each query's scores), then merged."""
    _, heads, n, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    # the rectangle: no mask, so the query heads sharing a KV head can be that head's query rows
    rows = q.reshape(1, kv_heads, group * n, head_dim)  # (1, kv_heads, group * n, head_dim)
    out_prefix, lse_prefix = flash(rows, keys[:, :, :start], values[:, :, :start], 0.0, False, scale=scale)
    out_prefix = out_prefix.reshape(1, heads, n, head_dim)
    lse_prefix = lse_prefix.reshape(1, heads, n)
    # the triangle: causal, one KV head per query head (n keys: a small copy)
    new_keys = keys[:, :, start:].repeat_interleave(group, dim=1)  # (1, heads, n, head_dim)
    new_values = values[:, :, start:].repeat_interleave(group, dim=1)
    out_new, lse_new = flash(q, new_keys, new_values, 0.0, True, scale=scale)
    # softmax over both parts = each part's softmax weighted by its share of the exp-sum
    share_prefix = torch.sigmoid(lse_prefix - lse_new)[..., None].to(out_new.dtype)  # (1, heads, n, 1)
    return out_new + (out_prefix - out_new) * share_prefix
