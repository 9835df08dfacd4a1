"""Chapter 12 exercises `ch12.quantize_int8` and `ch12.dequantize_int8`: a weight matrix in
symmetric int8 codes, one scale per output channel, and back."""

import torch


def quantize_per_channel(weight: torch.Tensor, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes for a linear layer's weight, with one scale per output channel (row).

    weight: (N, K) floats, as nn.Linear holds it: row n holds the K input weights of output n. Do not modify it.
    clip: 0 < clip <= 1, the share of the row's largest magnitude that code 127 stands for.
    For every row n:
        scale[n]    = clip * max_k |weight[n, k]| / 127          (a row of zeros: scale[n] = 1)
        codes[n, k] = clamp(round(weight[n, k] / scale[n]), -127, 127)
    round goes to the nearest integer, and a half to the even neighbour, as torch.round does (2.5 -> 2,
    3.5 -> 4, -2.5 -> -2): not toward zero. With clip = 1 the row's largest weight gets code ±127; with
    clip < 1 every weight beyond clip * max|w| lands past ±127 and is clamped (clipped) there. Code -128 is
    never used: the codes are symmetric about zero.
    Return (codes, scale): codes an int8 tensor (N, K), scale a float32 tensor (N,), so that
    weight[n, k] ≈ codes[n, k] * scale[n] — within scale[n] / 2 for every weight that was not clipped.
    Example: [[0.5, -1.27, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0], [127.0, 2.5, -2.7, 3.5]] -> scale [0.01, 1.0, 1.0],
    codes [[50, -127, 30, 0], [0, 0, 0, 0], [127, 2, -3, 4]]; with clip=0.5, scale [0.005, 1.0, 0.5] and the
    last row's codes [127, 5, -5, 7] (127 / 0.5 = 254 is clamped to 127).
    Errors: none to raise.
    """
    raise NotImplementedError("ch12.quantize_int8: one scale per row, then round and clamp each weight")


def dequantize_per_channel(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The weights that int8 codes and their per-row scales stand for.

    codes: (N, K) int8; scale: (N,) float32, scale[n] the scale of row n. Do not modify them.
    Return a float32 tensor (N, K) with entry [n, k] = codes[n, k] * scale[n].
    Example: codes [[50, -127, 30, 0], [127, 2, -3, 4]], scale [0.01, 0.5] ->
    [[0.5, -1.27, 0.3, 0.0], [63.5, 1.0, -1.5, 2.0]].
    """
    raise NotImplementedError("ch12.dequantize_int8: multiply each row's codes by its scale")
