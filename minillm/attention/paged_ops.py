"""Paged-attention operations in plain torch: the reference every other implementation must match.

The paged cache of one layer is a pile of fixed-size blocks; a sequence's tokens live in the
blocks its block table lists, in order:

    k_cache: (num_blocks, block_size, num_kv_heads, head_dim)

    block table of seq 0:  [7, 2, 9]          block_size = 4, context_len = 10
    token t lives in block table[t // 4] at offset t % 4; its *slot* is block * 4 + offset
    tokens 0-3 -> block 7 | tokens 4-7 -> block 2 | tokens 8-9 -> block 9 (2 of 4 used)

A quantized cache (chapter 12) holds codes instead of floats — int8 with a scale per token and head in
`k_scale` / `v_scale` (num_blocks, block_size, num_kv_heads), or fp8 bit patterns — written here by
`store_kv` and turned back into floats as they are gathered (minillm/attention/kv_codes.py).

`minillm/attention/triton_paged.py` has Triton kernels with the same signatures, used on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.attention.causal import causal_attention
from minillm.attention.kv_codes import dequantize, is_quantized, quantize


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Write each new token's K and V into its slot (as codes, in a quantized cache).

    k, v: (num_tokens, num_kv_heads, head_dim); slot_mapping: (num_tokens,) int, slot = block * block_size + offset.
    """
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if is_quantized(cache):
            x, scale = quantize(x, "int8" if cache.dtype == torch.int8 else "fp8")
            if scale is not None:
                scales.view(num_blocks * block_size, kv_heads)[slot_mapping] = scale
        cache.view(num_blocks * block_size, kv_heads, head_dim)[slot_mapping] = x


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int, scales: torch.Tensor | None = None,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """One sequence's first `length` tokens, in order: (length, num_kv_heads, head_dim) (a copy; from a
    quantized cache, dequantized to `dtype`)."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = block_table[:num_blocks]
    gathered = cache.index_select(0, blocks).flatten(0, 1)[:length]
    if not is_quantized(cache):
        return gathered
    return dequantize(gathered, None if scales is None else scales.index_select(0, blocks).flatten(0, 1)[:length],
                      dtype)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's one new query attends over its `context_len` cached tokens (its own included).

    q: (num_seqs, num_heads, head_dim); block_tables: (num_seqs, max_blocks) int, entries past a
    sequence's last block are never read; context_lens: (num_seqs,) int >= 1.
    Returns (num_seqs, num_heads, head_dim).
    """
    num_seqs, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    longest = int(context_lens.max())
    num_blocks = -(-longest // block_size)
    blocks = block_tables[:, :num_blocks].reshape(-1)
    keys, values = (_gather_blocks(cache, scales, blocks, num_seqs, longest, q.dtype)
                    for cache, scales in ((k_cache, k_scale), (v_cache, v_scale)))
    visible = torch.arange(longest, device=q.device)[None, :] < context_lens[:, None]  # (num_seqs, longest)
    # GQA: the query heads sharing a KV head become that head's query rows
    queries = q.view(num_seqs, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(queries, keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=visible[:, None, None], scale=scale)
    return out.reshape(num_seqs, heads, head_dim)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_starts: torch.Tensor, query_lens: torch.Tensor,
                            context_starts: torch.Tensor, scale: float, out: torch.Tensor,
                            max_query_len: int | None = None, k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> None:
    """Prefill / extend attention: sequence i's query_lens[i] new tokens, rows query_starts[i]... of q,
    sit at positions context_starts[i]... and attend causally to every cached token up to their own
    (their own K/V must already be stored). Writes those rows of `out`; other rows are left alone.
    No masked score is computed that can be skipped (`minillm/attention/causal.py`).

        sequence i:  | cached before this chunk (context_starts[i]) | the chunk (query_lens[i]) |
        new token j (position context_starts[i] + j) sees keys 0 .. context_starts[i] + j

    q, out: (num_tokens, num_heads, head_dim); block_tables: (num_seqs, max_blocks) int;
    query_starts, query_lens, context_starts: (num_seqs,) int; `max_query_len` is unused here (the
    Triton version sizes its grid with it).
    """
    for i, (row, n, start) in enumerate(zip(query_starts.tolist(), query_lens.tolist(), context_starts.tolist())):
        end = start + n
        # (1, kv_heads, end, head_dim)
        keys = gather_kv(k_cache, block_tables[i], end, k_scale, q.dtype).transpose(0, 1)[None]
        values = gather_kv(v_cache, block_tables[i], end, v_scale, q.dtype).transpose(0, 1)[None]
        queries = q[row : row + n].transpose(0, 1)[None]  # (1, heads, n, head_dim)
        out[row : row + n] = causal_attention(queries, keys, values, start, scale)[0].transpose(0, 1)


def _gather_blocks(cache: torch.Tensor, scales: torch.Tensor | None, blocks: torch.Tensor, num_seqs: int, longest: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """(num_seqs, longest, kv_heads, head_dim): every sequence's blocks in order, padded to the longest
    (index_select copies whole blocks; much faster on CPU than advanced indexing), dequantized to `dtype`
    from a quantized cache."""
    _, block_size, kv_heads, head_dim = cache.shape
    gathered = cache.index_select(0, blocks).view(num_seqs, -1, kv_heads, head_dim)[:, :longest]
    if not is_quantized(cache):
        return gathered
    return dequantize(gathered, None if scales is None else
                      scales.index_select(0, blocks).view(num_seqs, -1, kv_heads)[:, :longest], dtype)
