"""Fused elementwise operators for the CPU (float32): RMSNorm (with the residual add before it),
RoPE in place, and SiLU-and-multiply, each one pass of a small C kernel (`csrc/fused_cpu.c`).

Why: in a decode step of a small model the elementwise operators cost more than their arithmetic.
`F.rms_norm` alone runs eight operators on a CPU (pow, mean, add, rsqrt, mul, copies), ~20 µs for
32 rows of 256, where an add takes 3 µs; RoPE is eight more per layer. Fused, each is one call.
vLLM's CPU backend ships the same three (fused_add_rms_norm, rotary_embedding, silu_and_mul).

`usable(*tensors)` says when the kernels run: the library built (minillm/native.py), every tensor
a float32 CPU tensor not tracked by autograd, and no torch.compile tracing (Inductor fuses these
itself). Otherwise the layers run their torch code, which the kernels equal up to float rounding
(tests/test_fused_cpu.py). `MINILLM_FUSED_CPU=0` in the environment turns them off.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from minillm import native

SOURCE = Path(__file__).with_name("csrc") / "fused_cpu.c"
_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded kernels, or why there are none (then every layer runs its torch code)."""
    if os.environ.get("MINILLM_FUSED_CPU", "1") == "0":
        return "turned off by MINILLM_FUSED_CPU=0"
    library = native.load(SOURCE)
    if isinstance(library, str):
        return library
    library.rms_norm_f32.argtypes = [_P, _P, _P, _P, _P, _L, _I, _F]
    library.rope_f32.argtypes = [_P, _L, _P, _P, _L, _I, _I]
    library.silu_mul_f32.argtypes = [_P, _P, _L, _I]
    for kernel in (library.rms_norm_f32, library.rope_f32, library.silu_mul_f32):
        kernel.restype = None
    return library


def unavailable_reason() -> str | None:
    library = _library()
    return library if isinstance(library, str) else None


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the fused kernels may run on these tensors (else: the torch code). Called a few times per
    layer, so written for speed (is_cpu, `is` on dtypes: ~0.5 µs, where .device.type costs ~0.3 µs a tensor)."""
    for t in tensors:
        if not t.is_cpu or t.dtype is not torch.float32 or (t.requires_grad and torch.is_grad_enabled()):
            return False
    return not torch.compiler.is_compiling() and not isinstance(_library(), str)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, summed): summed = x + residual (x itself without one), normed = summed / rms · weight.
    x, residual: (..., size); weight: (size,)."""
    x = x.contiguous()
    size = x.shape[-1]
    rows = x.numel() // size if size else 0
    out = torch.empty_like(x)
    if residual is None:
        summed = x
        _library().rms_norm_f32(x.data_ptr(), None, None, weight.data_ptr(), out.data_ptr(), rows, size, eps)
    else:
        residual = residual.contiguous()
        summed = torch.empty_like(x)
        _library().rms_norm_f32(x.data_ptr(), residual.data_ptr(), summed.data_ptr(), weight.data_ptr(),
                                out.data_ptr(), rows, size, eps)
    return out, summed


def rope_(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """Rotate, in place, the first `heads` heads of every row of `qkv` (num_tokens, row): q's heads
    then k's, adjacent in the fused projection's output. cos, signed_sin: (num_tokens, 1, head_dim)."""
    if qkv.stride(-1) != 1 or qkv.shape[-1] < heads * head_dim:
        raise ValueError(f"qkv must be rows of at least {heads * head_dim} contiguous values, got {tuple(qkv.shape)}")
    cos, signed_sin = cos.contiguous(), signed_sin.contiguous()
    _library().rope_f32(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), qkv.shape[0],
                        heads, head_dim)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up]: (num_tokens, 2 * size) -> (num_tokens, size)."""
    gate_up = gate_up.contiguous()
    size = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], size)
    _library().silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), out.numel() // size if size else 0, size)
    return out
