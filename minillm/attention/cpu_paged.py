"""Paged decode attention as a small C kernel for the CPU (float32), with the signatures of
`minillm/attention/paged_ops.py`.

The torch reference gathers every sequence's blocks into one padded copy (index_select) and hands it
to SDPA: each step copies the whole KV context of the batch, in every layer, before reading it again.
The kernel (`minillm/attention/csrc/paged_decode.c`) reads each cached K/V row once, in place through
the block table, with an online softmax — the CPU twin of the Triton decode kernel. On the shipped
model's attention shape it takes 2-5x less time than the reference (benchmarks/cpu_decode_kernel.py),
reading 14-30 GB/s on a 2-core machine whose memory streams about 30.

It is built on first use with the machine's C compiler and cached (minillm/native.py), loaded with
ctypes and registered as the torch operator `minillm::paged_decode_attention_cpu`, so a compiled step
(chapter 8) calls it as one opaque kernel. Its OpenMP threads are torch's own (the same libgomp):
`torch.set_num_threads` governs them. Prefill attention and the K/V store stay the torch reference's.

`unavailable_reason()` says why the kernel cannot run here (no compiler, a build error); the engine
then uses the torch reference and logs why.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from minillm import native
from minillm.attention.paged_ops import paged_prefill_attention, store_kv

__all__ = ["paged_decode_attention", "paged_prefill_attention", "store_kv", "unavailable_reason"]

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded kernel (minillm/native.py builds it), or why there is none."""
    library = native.load(SOURCE)
    if isinstance(library, str):
        return library
    kernel = library.paged_decode_attention_f32
    kernel.restype = ctypes.c_int  # the rows it refused to read (a length or a block id out of range)
    kernel.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 7 + [ctypes.c_float]
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
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    width = tables.shape[1]
    out = torch.empty_like(q)
    refused = library.paged_decode_attention_f32(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
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


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """As `paged_ops.paged_decode_attention`: q (num_seqs, num_heads, head_dim) float32 on the CPU,
    block_tables (num_seqs, width) int, context_lens (num_seqs,) int >= 1 -> (num_seqs, num_heads, head_dim)."""
    if q.dtype != torch.float32 or k_cache.dtype != torch.float32:
        raise ValueError(f"the C kernel is float32 only, got q {q.dtype} and cache {k_cache.dtype}")
    return _paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
