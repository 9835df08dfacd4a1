"""Paged attention as small C kernels for the CPU (float32), decode and prefill, with the signatures of
`minillm/attention/paged_ops.py`.

The torch reference gathers every sequence's blocks into one copy (index_select) and hands it to
SDPA: each step copies the whole KV context of the batch, in every layer, before reading it again.
The kernels (`minillm/attention/csrc/paged_attention.c`) read each cached K/V row in place through the
block table, with an online softmax — the CPU twins of the Triton kernels. On the shipped model's
attention shape decode takes 2-5x less time than the reference, reading 14-30 GB/s on a 2-core machine
whose memory streams about 30; prefill 1.2-2x less than gathering the context and calling SDPA's flash
kernel (benchmarks/cpu_attention_kernels.py).

It is built on first use with the machine's C compiler and cached (minillm/native.py), loaded with
ctypes and registered as the torch operator `minillm::paged_decode_attention_cpu`, so a compiled step
(chapter 8) calls it as one opaque kernel; prefill runs only eagerly and is a plain function. Their
OpenMP threads are torch's own (the same libgomp): `torch.set_num_threads` governs them. The K/V store
is a loop of row copies in C (two indexed writes through torch cost ~30 µs a layer, mostly dispatch);
inside a compiled step it is the torch reference's, which Inductor fuses.

`unavailable_reason()` says why the kernel cannot run here (no compiler, a build error); the engine
then uses the torch reference and logs why.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from minillm import native
from minillm.attention import paged_ops

__all__ = ["paged_decode_attention", "paged_prefill_attention", "store_kv", "unavailable_reason"]

SOURCE = Path(__file__).with_name("csrc") / "paged_attention.c"


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded kernel (minillm/native.py builds it), or why there is none."""
    library = native.load(SOURCE)
    if isinstance(library, str):
        return library
    decode, prefill = library.paged_decode_attention_f32, library.paged_prefill_attention_f32
    store = library.store_kv_f32
    decode.restype = prefill.restype = store.restype = ctypes.c_int  # what they refused (out-of-range ids)
    pointer, long = ctypes.c_void_p, ctypes.c_long
    decode.argtypes = [pointer, long] + [pointer] * 5 + [ctypes.c_int] * 7 + [ctypes.c_float]
    store.argtypes = [pointer, long, pointer, long, pointer, ctypes.c_int, pointer, pointer, ctypes.c_int, long]
    prefill.argtypes = [pointer, long] + [pointer] * 7 + [long] + [ctypes.c_int] * 7 + [ctypes.c_float]
    return library


def unavailable_reason(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> str | None:
    """None when the kernel can run for this device and dtype, else why not."""
    if torch.device(device).type != "cpu":
        return f"the C kernel is for the CPU, not {torch.device(device).type}"
    if dtype != torch.float32:
        return f"the C kernel is float32 only, not {dtype}"
    library = _library()
    return library if isinstance(library, str) else None


@torch.library.custom_op("minillm::paged_decode_attention_cpu", mutates_args=())
def _paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the CPU paged-attention kernel is unavailable: {library}")
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:  # a sequence's heads side by side; sequences any distance apart
        q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    width = tables.shape[1]
    out = torch.empty_like(q)
    refused = library.paged_decode_attention_f32(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                                 tables.data_ptr(), lens.data_ptr(), out.data_ptr(), num_seqs,
                                                 num_heads, num_kv_heads, head_dim, block_size, width, num_blocks,
                                                 scale)
    if refused:
        raise ValueError(f"{refused} of {num_seqs} rows not read: context lengths must be in [1, {width * block_size}]"
                         f" (the block tables' width x block_size), and no block id outside [0, {num_blocks})")
    return out


@_paged_decode_attention.register_fake
def _(q, k_cache, v_cache, block_tables, context_lens, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """As `paged_ops.store_kv`: k, v (num_tokens, num_kv_heads, head_dim) into their slots (num_tokens,) int64."""
    if torch.compiler.is_compiling():  # Inductor fuses the reference's writes
        paged_ops.store_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    library = _library()
    if (isinstance(library, str) or not _float32_cpu(k, v, k_cache, v_cache) or slot_mapping.dtype is not torch.int64
            or k.stride(2) != 1 or k.stride(1) != k.shape[2] or v.stride(2) != 1 or v.stride(1) != v.shape[2]
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k.shape[1:] != k_cache.shape[2:]
            or v.shape != k.shape or v_cache.shape != k_cache.shape or len(slot_mapping) != len(k)):
        paged_ops.store_kv(k, v, k_cache, v_cache, slot_mapping)  # the reference (and its errors)
        return
    slots = slot_mapping.contiguous()
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    refused = library.store_kv_f32(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), slots.data_ptr(), len(slots),
                                   k_cache.data_ptr(), v_cache.data_ptr(), num_kv_heads * head_dim,
                                   num_blocks * block_size)
    if refused:
        raise IndexError(f"{refused} of {len(slots)} slots outside the cache's [0, {num_blocks * block_size})")


def _float32_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.is_cpu and t.dtype is torch.float32 for t in tensors)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """As `paged_ops.paged_decode_attention`: q (num_seqs, num_heads, head_dim) float32 on the CPU,
    block_tables (num_seqs, width) int, context_lens (num_seqs,) int >= 1 -> (num_seqs, num_heads, head_dim)."""
    if q.dtype != torch.float32 or k_cache.dtype != torch.float32:
        raise ValueError(f"the C kernel is float32 only, got q {q.dtype} and cache {k_cache.dtype}")
    return _paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_starts: torch.Tensor, query_lens: torch.Tensor,
                            context_starts: torch.Tensor, scale: float, out: torch.Tensor,
                            max_query_len: int | None = None) -> None:
    """As `paged_ops.paged_prefill_attention`: sequence i's query_lens[i] new tokens, rows
    query_starts[i]... of q (num_tokens, num_heads, head_dim), at positions context_starts[i]...,
    attend causally through block_tables[i] to everything cached up to their own; writes those rows
    of `out` in place. float32 on the CPU. (Eager only: prefill steps are never compiled.)"""
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the CPU paged-attention kernel is unavailable: {library}")
    if q.dtype != torch.float32 or k_cache.dtype != torch.float32 or out.dtype != torch.float32:
        raise ValueError(f"the C kernel is float32 only, got q {q.dtype}, cache {k_cache.dtype}, out {out.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:  # a token's heads side by side; tokens any distance apart
        q = q.contiguous()
    if out.stride(2) != 1 or out.stride(1) != out.shape[2]:
        raise ValueError("out must hold each token's heads side by side")
    tables = block_tables.to(torch.int32).contiguous()
    starts, lens, contexts = (t.to(torch.int32).contiguous() for t in (query_starts, query_lens, context_starts))
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    refused = library.paged_prefill_attention_f32(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), starts.data_ptr(),
        lens.data_ptr(), contexts.data_ptr(), out.data_ptr(), out.stride(0), len(lens), q.shape[1], num_kv_heads,
        head_dim, block_size, tables.shape[1], num_blocks, scale)
    if refused:
        raise ValueError(f"{refused} of {len(lens)} sequences not read: their new tokens must lie within their block "
                         f"tables (width x {block_size} positions), and no block id outside [0, {num_blocks})")
