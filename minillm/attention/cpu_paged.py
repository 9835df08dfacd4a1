"""Paged decode attention as a small C kernel for the CPU (float32), with the signatures of
`minillm/attention/paged_ops.py`.

The torch reference gathers every sequence's blocks into one padded copy (index_select) and hands it
to SDPA: each step copies the whole KV context of the batch, in every layer, before reading it again.
The kernel (`minillm/attention/csrc/paged_decode.c`) reads each cached K/V row once, in place through
the block table, with an online softmax — the CPU twin of the Triton decode kernel. On the shipped
model's attention shape it takes 2-5x less time than the reference (benchmarks/cpu_decode_kernel.py),
reading 14-30 GB/s on a 2-core machine whose memory streams about 30.

It is built on first use with the machine's C compiler (the one torch.compile's CPU backend needs
too), cached under ~/.cache/minillm/kernels/ (or $MINILLM_CACHE), loaded with ctypes and registered as
the torch operator `minillm::paged_decode_attention_cpu`, so a compiled step (chapter 8) calls it
as one opaque kernel. Its OpenMP threads are torch's own (the same libgomp): `torch.set_num_threads`
governs them. Prefill attention and the K/V store stay the torch reference's.

`unavailable_reason()` says why the kernel cannot run here (no compiler, a build error); the engine
then uses the torch reference and logs why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from minillm.attention.paged_ops import paged_prefill_attention, store_kv

__all__ = ["paged_decode_attention", "paged_prefill_attention", "store_kv", "unavailable_reason"]

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def _cache_dir() -> Path:
    root = os.environ.get("MINILLM_CACHE") or Path.home() / ".cache" / "minillm"
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    """What -march=native compiled for: the CPU's feature flags (a shared home on another CPU rebuilds)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded kernel, or why there is none."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler found (set CC, or install gcc)"
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"paged_decode-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # built aside, then moved: never half a file
                built = Path(tmp) / target.name
                try:
                    run = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"],
                                         capture_output=True, text=True, timeout=120)
                except (OSError, subprocess.TimeoutExpired) as err:
                    return f"the C compiler {compiler!r} could not run: {err}"
                if run.returncode:
                    return f"building {SOURCE.name} failed: {run.stderr.strip()[-500:]}"
                os.replace(built, target)
        except OSError as err:  # a cache folder that cannot be written (a read-only home)
            return f"the kernel cache {target.parent} is not writable ({err}); set MINILLM_CACHE to a folder that is"
    try:
        library = ctypes.CDLL(str(target))
    except OSError as err:
        return f"loading {target} failed: {err}"
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
