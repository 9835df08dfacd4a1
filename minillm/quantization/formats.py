"""Weights in fewer bits: the number formats and how a float tensor maps onto them (chapter 12).

A quantized weight is an integer code per weight and a float scale shared by a run of weights:
w ≈ q · scale (+ an offset for asymmetric codes). Which run shares a scale decides the error:

    per tensor     one scale for the whole matrix: one outlier weight stretches every weight's step
    per channel    one scale per output row (what int8 weight-only uses): a row's outliers stay in it
    per group      one scale per `group_size` consecutive inputs of a row (int4: 32-128): smaller runs,
                   tighter ranges, and the scales cost 16-32 bits per group

Symmetric codes centre on zero (int8: q in [-127, 127], scale = max|w| / 127); asymmetric ones cover
[min, max] of the run (int4: q in [0, 15], w ≈ q · scale + minimum), which spends no code on a side of
zero the run does not reach. Rounding is to the nearest code (torch.round: half to even), then clamped.

Every function takes a (out_features, in_features) weight, as nn.Linear holds it, and returns tensors
on its device; the scales are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127  # symmetric int8 codes: [-127, 127] (-128 unused: the range stays symmetric)
INT4_LEVELS = 15  # asymmetric int4 codes: [0, 15]
GROUP_SIZES = (32, 64, 128)  # what the int4 kernels take


@dataclass(frozen=True)
class Int8Weight:
    """Symmetric int8, one scale per output channel: w[n, k] ≈ q[n, k] · scale[n]."""

    q: torch.Tensor  # (N, K) int8
    scale: torch.Tensor  # (N,) float32

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()


@dataclass(frozen=True)
class Int4Weight:
    """Asymmetric int4 in groups of `group_size` inputs: w[n, k] ≈ q[n, k] · scale[n, g] + minimum[n, g],
    g = k // group_size. `packed` holds two codes per byte: q[n, 2j] in the low nibble, q[n, 2j + 1] in the high."""

    packed: torch.Tensor  # (N, K // 2) uint8
    scale: torch.Tensor  # (N, K // group_size) float32
    minimum: torch.Tensor  # (N, K // group_size) float32
    group_size: int

    @property
    def q(self) -> torch.Tensor:
        """(N, K) the codes, 0..15, as uint8."""
        return unpack_int4(self.packed)

    def dequantize(self) -> torch.Tensor:
        n, k = self.packed.shape[0], self.packed.shape[1] * 2
        codes = self.q.float().view(n, k // self.group_size, self.group_size)
        return (codes * self.scale[..., None] + self.minimum[..., None]).view(n, k)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 4 * (self.scale.numel() + self.minimum.numel())


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Per output channel, symmetric: scale = max|w| of the row / 127 (an all-zero row gets scale 1)."""
    _check_matrix(weight)
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Weight(q, scale)


def quantize_int4(weight: torch.Tensor, group_size: int) -> Int4Weight:
    """Per group of `group_size` inputs, asymmetric over the group's [min, max] (a constant group gets
    scale 1 and is exact)."""
    _check_matrix(weight)
    n, k = weight.shape
    check_group_size(group_size, k)
    w = weight.detach().float().view(n, k // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = torch.where(high > low, (high - low) / INT4_LEVELS, torch.ones_like(low))
    q = torch.clamp(torch.round((w - low[..., None]) / scale[..., None]), 0, INT4_LEVELS).to(torch.uint8)
    return Int4Weight(pack_int4(q.view(n, k)), scale, low, group_size)


def quantize_per_tensor_int8(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 with one scale for the whole matrix, dequantized: the baseline a single outlier ruins."""
    w = weight.detach().float()
    amax = w.abs().max()
    scale = amax / INT8_MAX if amax > 0 else torch.tensor(1.0, device=w.device)
    return torch.clamp(torch.round(w / scale), -INT8_MAX, INT8_MAX) * scale


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(N, K) codes 0..15 -> (N, K // 2) uint8, the even input in the low nibble."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K // 2) uint8 -> (N, K) codes 0..15 (uint8)."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)


def check_group_size(group_size: int, in_features: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in GROUP_SIZES:
        raise ValueError(f"quantization_group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if in_features % group_size:
        raise ValueError(f"quantization_group_size {group_size} does not divide a layer's {in_features} inputs")


def _check_matrix(weight: torch.Tensor) -> None:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"a weight to quantize must be a 2-D float tensor, got {tuple(weight.shape)} "
                         f"{weight.dtype}")
