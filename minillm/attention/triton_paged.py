"""Paged-attention operations as Triton kernels, with the signatures of `minillm/attention/paged_ops.py`.

Three kernels, each launched on a grid of small independent programs:

* `store_kv`: one program per new token. It reads the token's slot, splits it into
  (block, offset) and copies the token's K and V, all KV heads at once, into that place of the caches.
  The (num_kv_heads, head_dim) tile is padded to powers of two and masked.

* `paged_decode_attention`: one program per (sequence, query head). With GQA several query heads
  read the same KV head: kv_head = head // (num_heads // num_kv_heads). The program walks the
  sequence's block table one block at a time and never holds more than one block of scores:

      block table of seq s: [7, 2, 9]     block_size = 4, context_len = 10

      block 7: k0 k1 k2 k3 -> scores s0..s3 --+
      block 2: k4 k5 k6 k7 -> scores s4..s7 --+--> running max m, running sum l, accumulator acc
      block 9: k8 k9 -- -- -> scores s8 s9    |    (the two slots past the end are masked out)
                                              v
                                        out = acc / l

  This is an online softmax: after each block's scores, with m' = max(m, max(scores)),

      acc = acc * exp(m - m') + sum_t exp(score_t - m') * v_t
      l   = l   * exp(m - m') + sum_t exp(score_t - m')

  so that acc / l is softmax(scores) @ V over every token seen so far. All of it is float32
  whatever the cache's dtype; only the output is cast back to the query's dtype.

* `paged_prefill_attention` (chapter 6): one program per (sequence, query head, tile of 16 new
  tokens) — the rows of a prefill, or of a chunk extending one. It runs the same online softmax
  over 32 keys at a time, a query tile against a key tile with `tl.dot`. A key tile may span
  several blocks, so each key finds its own block in the table; keys past a query's position are
  masked (causal with an offset: token j of a chunk starting at s sees keys 0 .. s + j):

      chunk of seq s: positions 40..63, its K/V already stored     block_size = 16
      query tile 0 (positions 40..55) reads keys 0..55, tile 1 (56..63) keys 0..63

The kernels follow the tensors' strides, so views (e.g. K and V split out of a fused QKV) work. The
decode kernel's shapes are small (one query row): it uses elementwise products and `tl.sum`.

A quantized cache (chapter 12: int8 codes with a scale per token and head, or fp8) is dequantized by
the attention kernels as they load each tile (`_dequantize`); `store_kv` makes the codes with torch
(minillm/attention/kv_codes.py) and copies them like floats.

Triton is optional: this module imports without it (`TRITON_AVAILABLE` is then False and the
functions raise RuntimeError). On a machine without a GPU, set `TRITON_INTERPRET=1` before triton is
first imported to run the kernels, slowly, in Triton's interpreter on CPU tensors.
"""

import torch

from minillm.attention import kv_codes

try:
    import triton
    import triton.language as tl

    TRITON_AVAILABLE = True
except ImportError:  # e.g. the CPU builds of torch, which do not depend on triton
    triton = None
    tl = None
    TRITON_AVAILABLE = False

__all__ = ["TRITON_AVAILABLE", "paged_decode_attention", "paged_prefill_attention", "store_kv",
           "unavailable_reason"]


if TRITON_AVAILABLE:

    @triton.jit
    def _store_kv_kernel(
        k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
        stride_k_token, stride_k_head, stride_k_dim,
        stride_v_token, stride_v_head, stride_v_dim,
        stride_kc_block, stride_kc_offset, stride_kc_head, stride_kc_dim,
        stride_vc_block, stride_vc_offset, stride_vc_head, stride_vc_dim,
        num_kv_heads, head_dim,
        BLOCK_SIZE: tl.constexpr, HEADS_PADDED: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    ):
        """One program per token: k[token] and v[token] (all KV heads) go to slot slot_mapping[token]."""
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)  # int64: block * stride can exceed 2**31
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE

        heads = tl.arange(0, HEADS_PADDED)[:, None]  # (HEADS_PADDED, 1)
        dims = tl.arange(0, HEAD_DIM_PADDED)[None, :]  # (1, HEAD_DIM_PADDED)
        mask = (heads < num_kv_heads) & (dims < head_dim)  # (HEADS_PADDED, HEAD_DIM_PADDED)

        k = tl.load(k_ptr + token * stride_k_token + heads * stride_k_head + dims * stride_k_dim, mask=mask)
        v = tl.load(v_ptr + token * stride_v_token + heads * stride_v_head + dims * stride_v_dim, mask=mask)
        k_dest = k_cache_ptr + block * stride_kc_block + offset * stride_kc_offset
        v_dest = v_cache_ptr + block * stride_vc_block + offset * stride_vc_offset
        tl.store(k_dest + heads * stride_kc_head + dims * stride_kc_dim, k.to(k_cache_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(v_dest + heads * stride_vc_head + dims * stride_vc_dim, v.to(v_cache_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _dequantize(stored, scale_ptrs, rows_mask, KV_CODES: tl.constexpr):
        """A (rows, HEAD_DIM_PADDED) tile as loaded from the cache -> float32: floats as they are; int8 codes
        times their row's scale (loaded from `scale_ptrs`, one per row); fp8 bit patterns viewed as e4m3."""
        if KV_CODES == 2:
            return stored.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        values = stored.to(tl.float32)
        if KV_CODES == 1:
            values = values * tl.load(scale_ptrs, mask=rows_mask, other=0.0).to(tl.float32)[:, None]
        return values

    @triton.jit
    def _paged_decode_attention_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
        k_scale_ptr, v_scale_ptr,
        stride_out_seq, stride_out_head, stride_out_dim,
        stride_q_seq, stride_q_head, stride_q_dim,
        stride_kc_block, stride_kc_offset, stride_kc_head, stride_kc_dim,
        stride_vc_block, stride_vc_offset, stride_vc_head, stride_vc_dim,
        stride_table_seq, stride_table_block,
        stride_ks_block, stride_ks_offset, stride_ks_head,
        head_dim, query_heads_per_kv_head,
        BLOCK_SIZE: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, KV_CODES: tl.constexpr,
    ):
        """One program per (sequence, query head): out[seq, head] = softmax(q K^T * scale) V, block by block.
        KV_CODES: 0 the cache holds floats, 1 int8 codes with a scale per token and head (k_scale_ptr,
        v_scale_ptr), 2 fp8 bit patterns — dequantized as they are loaded (chapter 12)."""
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        kv_head = head // query_heads_per_kv_head
        context_len = tl.load(context_lens_ptr + seq).to(tl.int32)

        dims = tl.arange(0, HEAD_DIM_PADDED)  # (HEAD_DIM_PADDED,)
        dim_mask = dims < head_dim
        offsets = tl.arange(0, BLOCK_SIZE)  # (BLOCK_SIZE,) token offsets inside a block

        q = tl.load(q_ptr + seq * stride_q_seq + head * stride_q_head + dims * stride_q_dim, mask=dim_mask, other=0.0)
        q = q.to(tl.float32)

        # the online-softmax state; typed tensors so that their type stays the same through the loop
        running_max = tl.full([], float("-inf"), tl.float32)
        running_sum = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([HEAD_DIM_PADDED], dtype=tl.float32)

        table_row = block_tables_ptr + seq * stride_table_seq
        k_head = k_cache_ptr + kv_head * stride_kc_head
        v_head = v_cache_ptr + kv_head * stride_vc_head
        ks_head = k_scale_ptr + kv_head * stride_ks_head
        vs_head = v_scale_ptr + kv_head * stride_ks_head
        num_blocks = tl.cdiv(context_len, BLOCK_SIZE)  # only these table entries are read
        for logical_block in range(0, num_blocks):
            physical_block = tl.load(table_row + logical_block * stride_table_block).to(tl.int64)
            visible = logical_block * BLOCK_SIZE + offsets < context_len  # (BLOCK_SIZE,)
            tile_mask = visible[:, None] & dim_mask[None, :]  # (BLOCK_SIZE, HEAD_DIM_PADDED)

            k_tile = k_head + physical_block * stride_kc_block + offsets[:, None] * stride_kc_offset
            keys = _dequantize(tl.load(k_tile + dims[None, :] * stride_kc_dim, mask=tile_mask, other=0),
                               ks_head + physical_block * stride_ks_block + offsets * stride_ks_offset, visible,
                               KV_CODES)
            scores = tl.sum(keys * q[None, :], axis=1) * scale  # (BLOCK_SIZE,)
            scores = tl.where(visible, scores, float("-inf"))

            # every block holds at least one visible token, so new_max is finite; on the first
            # block running_max is -inf and the rescale factor exp(-inf) = 0 wipes the empty state
            new_max = tl.maximum(running_max, tl.max(scores, axis=0))
            rescale = tl.exp(running_max - new_max)
            weights = tl.exp(scores - new_max)  # (BLOCK_SIZE,), 0 where not visible

            v_tile = v_head + physical_block * stride_vc_block + offsets[:, None] * stride_vc_offset
            values = _dequantize(tl.load(v_tile + dims[None, :] * stride_vc_dim, mask=tile_mask, other=0),
                                 vs_head + physical_block * stride_ks_block + offsets * stride_ks_offset, visible,
                                 KV_CODES)
            acc = acc * rescale + tl.sum(weights[:, None] * values, axis=0)  # (HEAD_DIM_PADDED,)
            running_sum = running_sum * rescale + tl.sum(weights, axis=0)
            running_max = new_max

        out = acc / running_sum
        out_ptrs = out_ptr + seq * stride_out_seq + head * stride_out_head + dims * stride_out_dim
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=dim_mask)

    @triton.jit
    def _paged_prefill_attention_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_starts_ptr, query_lens_ptr,
        context_starts_ptr, scale, k_scale_ptr, v_scale_ptr,
        stride_out_token, stride_out_head, stride_out_dim,
        stride_q_token, stride_q_head, stride_q_dim,
        stride_kc_block, stride_kc_offset, stride_kc_head, stride_kc_dim,
        stride_vc_block, stride_vc_offset, stride_vc_head, stride_vc_dim,
        stride_table_seq, stride_table_block,
        stride_ks_block, stride_ks_offset, stride_ks_head,
        head_dim, query_heads_per_kv_head,
        BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr, KV_CODES: tl.constexpr,
    ):
        """One program per (sequence, query head, tile of BLOCK_M new tokens): those tokens attend
        causally to the sequence's cached keys, BLOCK_N keys at a time, with an online softmax.
        UPCAST: compute the dots in float32 (Triton's interpreter gets bfloat16 tl.dot wrong).
        KV_CODES: as in the decode kernel; codes become q's dtype before the dots, as in the torch reference."""
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        tile = tl.program_id(2)
        num_queries = tl.load(query_lens_ptr + seq).to(tl.int32)
        first_row = tl.load(query_starts_ptr + seq).to(tl.int64)
        context_start = tl.load(context_starts_ptr + seq).to(tl.int32)
        kv_head = head // query_heads_per_kv_head

        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) new-token index inside the chunk
        row_mask = rows < num_queries
        positions = context_start + rows  # (BLOCK_M,) absolute positions of these queries
        dims = tl.arange(0, HEAD_DIM_PADDED)
        dim_mask = dims < head_dim
        q_ptrs = (q_ptr + (first_row + rows)[:, None] * stride_q_token + head * stride_q_head
                  + dims[None, :] * stride_q_dim)
        q = tl.load(q_ptrs, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)  # (BLOCK_M, HEAD_DIM_PADDED)
        if UPCAST:
            q = q.to(tl.float32)

        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)

        table_row = block_tables_ptr + seq * stride_table_seq
        k_head = k_cache_ptr + kv_head * stride_kc_head
        v_head = v_cache_ptr + kv_head * stride_vc_head
        ks_head = k_scale_ptr + kv_head * stride_ks_head
        vs_head = v_scale_ptr + kv_head * stride_ks_head
        # keys past the tile's last query are never visible to it: stop there
        key_end = tl.minimum(context_start + num_queries, context_start + (tile + 1) * BLOCK_M)
        key_end = tl.where(tile * BLOCK_M < num_queries, key_end, 0)  # the grid fits the longest chunk: idle tiles
        for key_start in range(0, key_end, BLOCK_N):
            keys_at = key_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
            key_mask = keys_at < key_end
            # each key's physical place: its block from the table, its offset inside the block
            blocks = tl.load(table_row + (keys_at // BLOCK_SIZE) * stride_table_block, mask=key_mask, other=0)
            blocks = blocks.to(tl.int64)
            offsets = keys_at % BLOCK_SIZE
            tile_mask = key_mask[:, None] & dim_mask[None, :]  # (BLOCK_N, HEAD_DIM_PADDED)
            k = tl.load(k_head + blocks[:, None] * stride_kc_block + offsets[:, None] * stride_kc_offset
                        + dims[None, :] * stride_kc_dim, mask=tile_mask, other=0)
            if KV_CODES != 0:
                k = _dequantize(k, ks_head + blocks * stride_ks_block + offsets * stride_ks_offset, key_mask,
                                KV_CODES).to(q.dtype)
            if UPCAST:
                k = k.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N)
            visible = (keys_at[None, :] <= positions[:, None]) & key_mask[None, :]
            scores = tl.where(visible, scores, float("-inf"))

            # key 0 is visible to every query, so after the first tile every row's max is finite
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp(running_max - new_max)  # (BLOCK_M,)
            weights = tl.exp(scores - new_max[:, None])  # (BLOCK_M, BLOCK_N), 0 where not visible
            v = tl.load(v_head + blocks[:, None] * stride_vc_block + offsets[:, None] * stride_vc_offset
                        + dims[None, :] * stride_vc_dim, mask=tile_mask, other=0)
            if KV_CODES != 0:
                v = _dequantize(v, vs_head + blocks * stride_ks_block + offsets * stride_ks_offset, key_mask,
                                KV_CODES).to(q.dtype)
            if UPCAST:
                v = v.to(tl.float32)
            update = tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)  # (BLOCK_M, HEAD_DIM_PADDED)
            acc = acc * rescale[:, None] + update
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            running_max = new_max

        # idle rows (past the chunk's end) have a zero sum: divide by 1 there, they are not stored anyway
        out = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
        out_ptrs = (out_ptr + (first_row + rows)[:, None] * stride_out_token + head * stride_out_head
                    + dims[None, :] * stride_out_dim)
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def unavailable_reason(device: torch.device) -> str | None:
    """Why the kernels cannot run on `device` on this machine, or None if they can: on CUDA, or
    anywhere in Triton's interpreter (TRITON_INTERPRET=1 when triton was first imported)."""
    if not TRITON_AVAILABLE:
        return "the `triton` package is not installed"
    if _interpreted():
        return None
    if device.type != "cuda":
        return (f"Triton compiles its kernels for a GPU, and this engine runs on {device.type} (to run them on "
                "the CPU in Triton's interpreter, set TRITON_INTERPRET=1 before triton is imported)")
    try:
        triton.runtime.driver.active  # noqa: B018 (raises when Triton finds no GPU driver)
    except RuntimeError as err:
        return f"Triton found no GPU driver: {err}"
    return None


def _interpreted() -> bool:
    """True when the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_store_kv_kernel, InterpretedFunction)


def _require_triton() -> None:
    if not TRITON_AVAILABLE:
        raise RuntimeError("minillm.attention.triton_paged needs the `triton` package, which is not installed "
                           "(use minillm.attention.paged_ops, the torch version, instead)")


def _check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on the same device, got {devices}")


def _check_cache_shapes(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must both be (num_blocks, block_size, num_kv_heads, head_dim), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")


def _check_against_cache(num_seqs: int, num_heads: int, head_dim: int, k_cache: torch.Tensor,
                         block_tables: torch.Tensor) -> tuple[int, int]:
    """What both attention kernels need of the query heads, the cache and the block tables; returns
    (block_size, num_kv_heads)."""
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if head_dim != cache_head_dim:
        raise ValueError(f"q has head_dim {head_dim} but the cache has {cache_head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_size & (block_size - 1) != 0:
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be ({num_seqs}, max_blocks), got {tuple(block_tables.shape)}")
    return block_size, num_kv_heads


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Write each new token's K and V into its slot, in place.

    k, v: (num_tokens, num_kv_heads, head_dim); k_cache, v_cache: (num_blocks, block_size, num_kv_heads,
    head_dim); slot_mapping: (num_tokens,) int32 or int64, slot = block * block_size + offset, each in
    [0, num_blocks * block_size) (not checked: that would wait for the GPU).
    """
    _require_triton()
    _check_cache_shapes(k_cache, v_cache)
    if k.dim() != 3 or k.shape != v.shape or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k and v must both be (num_tokens, {k_cache.shape[2]}, {k_cache.shape[3]}) to match the "
                         f"cache, got {tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be ({k.shape[0]},), one slot per token, got {tuple(slot_mapping.shape)}")
    _check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    slot_mapping = slot_mapping.contiguous()  # the kernel reads slot_mapping[token] at offset `token`
    if kv_codes.is_quantized(k_cache):  # codes made by torch (kv_codes.py), copied by the kernel; scales indexed
        kind = "int8" if k_cache.dtype == torch.int8 else "fp8"
        (k, k_scales), (v, v_scales) = kv_codes.quantize(k, kind), kv_codes.quantize(v, kind)
        if k_scales is not None:
            k_scale.view(-1, num_kv_heads)[slot_mapping] = k_scales
            v_scale.view(-1, num_kv_heads)[slot_mapping] = v_scales

    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        num_kv_heads, head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        HEADS_PADDED=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PADDED=triton.next_power_of_2(head_dim),
    )


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's one new query attends over its `context_len` cached tokens (its own included).

    q: (num_seqs, num_heads, head_dim); k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)
    with a power-of-two block_size; block_tables: (num_seqs, max_blocks) int32 or int64, entries past a
    sequence's last block are never read; context_lens: (num_seqs,) int32 or int64, each >= 1 (not checked).
    Returns (num_seqs, num_heads, head_dim), in q's dtype.
    """
    _require_triton()
    _check_cache_shapes(k_cache, v_cache)
    if q.dim() != 3:
        raise ValueError(f"q must be (num_seqs, num_heads, head_dim), got {tuple(q.shape)}")
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = _check_against_cache(num_seqs, num_heads, head_dim, k_cache, block_tables)
    if context_lens.shape != (num_seqs,):
        raise ValueError(f"context_lens must be ({num_seqs},), got {tuple(context_lens.shape)}")
    _check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens)

    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (num_seqs, num_heads, head_dim)
    if num_seqs == 0:
        return out
    context_lens = context_lens.contiguous()  # the kernel reads context_lens[seq] at offset `seq`
    k_scale, v_scale, scale_strides, codes = _scales(k_cache, k_scale, v_scale)
    _paged_decode_attention_kernel[(num_seqs, num_heads)](
        out, q, k_cache, v_cache, block_tables, context_lens, float(scale), k_scale, v_scale,
        *out.stride(), *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *scale_strides,
        head_dim, num_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM_PADDED=triton.next_power_of_2(head_dim), KV_CODES=codes,
    )
    return out


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_starts: torch.Tensor, query_lens: torch.Tensor,
                            context_starts: torch.Tensor, scale: float, out: torch.Tensor,
                            max_query_len: int | None = None, k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> None:
    """Prefill / extend attention for many sequences in one launch (see `paged_ops.paged_prefill_attention`).

    q, out: (num_tokens, num_heads, head_dim); k_cache, v_cache: (num_blocks, block_size, num_kv_heads,
    head_dim) with a power-of-two block_size, holding the new tokens' K/V already; block_tables:
    (num_seqs, max_blocks) int; query_starts, query_lens, context_starts: (num_seqs,) int (rows of q,
    chunk lengths >= 1, tokens cached before each chunk; not checked: that would wait for the GPU).
    Writes the sequences' rows of `out`, in out's dtype. `max_query_len` (the longest chunk) sizes the
    grid; pass it when known, else it is read from query_lens (a wait for the GPU).
    """
    _require_triton()
    _check_cache_shapes(k_cache, v_cache)
    if q.dim() != 3 or out.shape != q.shape:
        raise ValueError(f"q and out must both be (num_tokens, num_heads, head_dim), got {tuple(q.shape)} and "
                         f"{tuple(out.shape)}")
    num_seqs = query_starts.shape[0]
    _, num_heads, head_dim = q.shape
    block_size, num_kv_heads = _check_against_cache(num_seqs, num_heads, head_dim, k_cache, block_tables)
    for name, t in (("query_starts", query_starts), ("query_lens", query_lens), ("context_starts", context_starts)):
        if t.shape != (num_seqs,):
            raise ValueError(f"{name} must be ({num_seqs},), one entry per sequence, got {tuple(t.shape)}")
    _check_same_device(q=q, out=out, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                       query_starts=query_starts, query_lens=query_lens, context_starts=context_starts)
    if num_seqs == 0:
        return
    longest = max_query_len if max_query_len is not None else int(query_lens.max())
    block_m = 16
    # the interpreter's bfloat16 tl.dot returns wrong values (triton-lang/triton#11584): float32 there
    upcast = _interpreted() and q.dtype == torch.bfloat16
    k_scale, v_scale, scale_strides, codes = _scales(k_cache, k_scale, v_scale)
    _paged_prefill_attention_kernel[(num_seqs, num_heads, triton.cdiv(longest, block_m))](
        out, q, k_cache, v_cache, block_tables, query_starts.contiguous(), query_lens.contiguous(),
        context_starts.contiguous(), float(scale), k_scale, v_scale,
        *out.stride(), *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *scale_strides,
        head_dim, num_heads // num_kv_heads,
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=32,
        HEAD_DIM_PADDED=max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs every dimension >= 16
        # float32 stays float32 ("ieee", not TF32's 10-bit mantissa): token-exact with the torch path
        PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32", UPCAST=upcast, KV_CODES=codes,
    )


def _scales(k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None):
    """What the attention kernels take for a cache's codes: (k_scale, v_scale, their strides, KV_CODES) —
    the cache itself and zero strides in place of scales it has none of (never read then)."""
    if not kv_codes.is_quantized(k_cache):
        return k_cache, k_cache, (0, 0, 0), 0
    if k_cache.dtype == torch.uint8:
        return k_cache, k_cache, (0, 0, 0), 2
    if k_scale is None or v_scale is None or k_scale.shape != k_cache.shape[:3] or v_scale.stride() != k_scale.stride():
        raise ValueError(f"an int8 cache needs k_scale and v_scale of shape {tuple(k_cache.shape[:3])}, alike")
    return k_scale, v_scale, k_scale.stride(), 1
