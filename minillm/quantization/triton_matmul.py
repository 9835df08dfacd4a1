"""Weight-only quantized matmul as a Triton kernel (CUDA; Triton's interpreter on the CPU in tests).

    out[m, n] = sum_k x[m, k] · w[n, k],   w dequantized on the fly from its codes

One program per (tile of BLOCK_M rows, tile of BLOCK_N output channels). It walks the inputs BLOCK_K at a
time: loads the activations' tile, loads the codes' tile — int8 codes, or int4 codes two to a byte
(q[n, k] is the low nibble of byte k // 2 for even k, the high for odd k) — turns the codes into weights
in registers, and multiplies the two tiles with `tl.dot`, accumulating in float32:

    int8:  the tile's dot product of the raw codes, times scale[n] once at the end (one scale per row)
    int4:  w = q · scale[n, k // G] + minimum[n, k // G] before the dot (the scale changes every G inputs)

The weights never exist in memory as floats: a decode step reads 1 or 0.5 bytes per weight instead of
2 (bfloat16) or 4 — the whole point on a GPU, whose decode steps wait on memory, not arithmetic.
`minillm/quantization/linear.py` calls it on CUDA; the torch reference beside it is the layer's own
`dequantize()` then F.linear.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    TRITON_AVAILABLE = True
except ImportError:
    triton = None
    tl = None
    TRITON_AVAILABLE = False

BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32

if TRITON_AVAILABLE:
    @triton.jit
    def _quantized_matmul_kernel(x_ptr, codes_ptr, scale_ptr, minimum_ptr, out_ptr, M, N, K,
                                 stride_xm, stride_codes, stride_scale, stride_om, group_size,
                                 INT4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """UPCAST: the dot in float32 (Triton's interpreter gets bfloat16 tl.dot wrong); otherwise the weights
        go to the activations' dtype for the dot, which accumulates in float32."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok, col_ok = rows < M, cols < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)  # (BLOCK_M, BLOCK_K)
            w_mask = k_ok[:, None] & col_ok[None, :]
            if INT4:
                byte = tl.load(codes_ptr + cols[None, :] * stride_codes + (ks // 2)[:, None], mask=w_mask, other=0)
                q = ((byte.to(tl.int32) >> ((ks % 2) * 4)[:, None]) & 0xF).to(tl.float32)  # (BLOCK_K, BLOCK_N)
                group = (ks // group_size)[:, None]
                scale = tl.load(scale_ptr + cols[None, :] * stride_scale + group, mask=w_mask, other=0.0)
                low = tl.load(minimum_ptr + cols[None, :] * stride_scale + group, mask=w_mask, other=0.0)
                w = q * scale + low
            else:
                w = tl.load(codes_ptr + cols[None, :] * stride_codes + ks[:, None], mask=w_mask,
                            other=0).to(tl.float32)
            if UPCAST:
                acc += tl.dot(x.to(tl.float32), w, input_precision=PRECISION)
            else:
                acc += tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
        if not INT4:
            acc = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


def int8_matmul(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (M, K) float; codes (N, K) int8; scale (N,) float32 -> (M, N) in x's dtype."""
    _check(x, codes.shape[1], codes, scale)
    return _launch(x, codes, scale, scale, codes.shape[0], codes.shape[1], 0, int4=False)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """x (M, K) float; packed (N, K // 2) uint8; scale, minimum (N, K // group_size) float32 -> (M, N)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    _check(x, k, packed, scale, minimum)
    if scale.shape != (n, k // group_size) or minimum.shape != scale.shape:
        raise ValueError(f"scale and minimum must be ({n}, {k // group_size}), got {tuple(scale.shape)} and "
                         f"{tuple(minimum.shape)}")
    return _launch(x, packed, scale, minimum, n, k, group_size, int4=True)


def _launch(x, codes, scale, minimum, n: int, k: int, group_size: int, int4: bool) -> torch.Tensor:
    x, codes, scale, minimum = x.contiguous(), codes.contiguous(), scale.float().contiguous(), \
        minimum.float().contiguous()
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    # the interpreter's bfloat16 tl.dot returns wrong values (triton-lang/triton#11584): float32 there
    upcast = x.dtype == torch.bfloat16 and interpreted()
    grid = (triton.cdiv(x.shape[0], BLOCK_M), triton.cdiv(n, BLOCK_N))
    _quantized_matmul_kernel[grid](x, codes, scale, minimum, out, x.shape[0], n, k, x.stride(0), codes.stride(0),
                                   scale.stride(0) if scale.dim() == 2 else 1, out.stride(0), max(group_size, 1),
                                   INT4=int4, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                                   PRECISION="ieee" if x.dtype == torch.float32 or upcast else "tf32", UPCAST=upcast)
    return out


def unavailable_reason(device: torch.device) -> str | None:
    """Why the kernel cannot run on `device` here (None: it can): CUDA, or Triton's interpreter."""
    if not TRITON_AVAILABLE:
        return "the `triton` package is not installed"
    if interpreted() or device.type == "cuda":
        return None
    return f"Triton compiles its kernels for a GPU, and this runs on {device.type}"


def interpreted() -> bool:
    """True when the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 when triton was first imported)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_quantized_matmul_kernel, InterpretedFunction)


def _check(x: torch.Tensor, k: int, *tensors: torch.Tensor) -> None:
    if not TRITON_AVAILABLE:
        raise RuntimeError("minillm.quantization.triton_matmul needs the `triton` package, which is not installed")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (rows, {k}), got {tuple(x.shape)}")
    if any(t.device != x.device for t in tensors):
        raise ValueError("x and the weight's tensors must be on one device")
