"""The paged KV cache in one byte per number (chapter 12): int8 with a scale per token and head, or fp8 (e4m3).

A decode step reads every cached K and V of every running request: at long contexts that, not the
weights, is most of the bytes a step moves — and the cache's size decides how many requests fit at
once. Stored in one byte instead of two (bfloat16) or four (float32):

    int8   codes[t, h, :] = round(k[t, h, :] / scale[t, h]),  scale[t, h] = max|k[t, h, :]| / 127 (float16)
           one scale per token and KV head: 2 more bytes per head_dim numbers; the scale stops at float16's
           largest, so a number beyond 127 x 65504 saturates (as fp8's do beyond 448) instead of reading NaN
    fp8    k[t, h, :] as float8_e4m3fn (3 mantissa bits, at most ±448: clamped), no scale — vLLM's
           `kv_cache_dtype="fp8"` with its default scale of 1

Each token's codes depend on that token's K/V alone — not on the block it lands in, the chunk it came
with, or the tokens beside it — so chunked prefill, the prefix cache, preemption and speculative
decoding store exactly the same codes as one long prefill would. (A scale per block would have to be
fixed by the block's first token, or the block re-quantized when a later token is larger.) And so the
oracle is simple: the naive loop with every K and V rounded through the same codes (`naive_greedy`).

fp8 codes are kept as uint8 bit patterns (PyTorch's CPU has no indexed copies of float8 tensors) and
viewed as float8_e4m3fn to convert.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest float8_e4m3fn
INT8_MAX = 127
SCALE_DTYPE = torch.float16
SCALE_MAX = torch.finfo(SCALE_DTYPE).max  # int8's scales: |k| up to 127 x 65504 (about 8.3e6), then saturated


def check_kv_cache_dtype(kv_cache_dtype: object) -> None:
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the cache's tensors: the model's ("auto"), int8 codes, or fp8 bit patterns as uint8."""
    return {"auto": model_dtype, "int8": torch.int8, "fp8": torch.uint8}[kv_cache_dtype]


def bytes_per_head(kv_cache_dtype: str, model_dtype: torch.dtype, head_dim: int) -> int:
    """Bytes of one token's K (or V) for one KV head: head_dim numbers, and int8's float16 scale."""
    if kv_cache_dtype == "auto":
        return head_dim * torch.empty((), dtype=model_dtype).element_size()
    return head_dim + (SCALE_DTYPE.itemsize if kv_cache_dtype == "int8" else 0)


def is_quantized(cache: torch.Tensor) -> bool:
    """Whether a cache tensor holds codes (int8 or fp8's uint8) rather than the model's floats."""
    return not cache.is_floating_point()


def quantize(x: torch.Tensor, kv_cache_dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: (tokens, heads, head_dim) floats -> (codes like x, scale (tokens, heads) float16 or None)."""
    if kv_cache_dtype == "fp8":
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8), None
    amax = x.float().abs().amax(dim=-1)
    # at most float16's largest (not inf: 0 · inf would read back NaN), so beyond 127 x 65504 values saturate
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).clamp(max=SCALE_MAX).to(SCALE_DTYPE)
    codes = torch.clamp(torch.round(x.float() / scale.float()[..., None]), -INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Codes (..., head_dim) and their scales (...) -> floats in `dtype` (fp8 when `codes` is uint8)."""
    if codes.dtype == torch.uint8:
        return codes.view(FP8).float().to(dtype)
    return (codes.float() * scale.float()[..., None]).to(dtype)


def round_trip(x: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """What reading `x` back from such a cache gives (x itself for "auto")."""
    if kv_cache_dtype == "auto":
        return x
    return dequantize(*quantize(x, kv_cache_dtype), x.dtype)
