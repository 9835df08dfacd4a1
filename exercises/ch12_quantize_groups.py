"""Chapter 12 exercises `ch12.quantize_int4` and `ch12.dequantize_int4`: a weight matrix in asymmetric
4-bit codes, a scale and a minimum per group of consecutive inputs, and back."""

import torch


def quantize_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes for a linear layer's weight, with a scale and a minimum per group of inputs.

    weight: (N, K) floats, as nn.Linear holds it (row n: the K input weights of output n). Do not modify it.
    group_size: G, which divides K. Each row is cut into K / G groups of G consecutive inputs: group g of
    row n is weight[n, g*G : (g+1)*G]. For every group (n, g), with lo and hi its smallest and largest weight:
        minimum[n, g] = lo
        scale[n, g]   = (hi - lo) / 15                      (a constant group, hi == lo: scale 1)
        codes[n, k]   = clamp(round((weight[n, k] - lo) / scale[n, g]), 0, 15)      for k in group g
    round goes to the nearest integer, a half to the even neighbour (torch.round). The 16 codes span the
    group's own range [lo, hi] — lo gets code 0, hi code 15 — not a range centred on zero.
    Return (codes, scale, minimum): codes a uint8 tensor (N, K) with values 0..15, scale and minimum float32
    tensors (N, K // G), so that weight[n, k] ≈ codes[n, k] * scale[n, k // G] + minimum[n, k // G].
    Example, G = 4: [[0.0, 1.5, 3.0, 7.5, -1.0, -1.0, -1.0, -1.0], [2.0, 3.5, 5.0, 17.0, 0.0, 15.0, 6.5, 7.5]]
    -> minimum [[0.0, -1.0], [2.0, 0.0]], scale [[0.5, 1.0], [1.0, 1.0]],
    codes [[0, 3, 6, 15, 0, 0, 0, 0], [0, 2, 3, 15, 0, 15, 6, 8]] (1.5 -> 2 and 6.5 -> 6: halves go to even).
    Errors: none to raise.
    """
    raise NotImplementedError("ch12.quantize_int4: per group of G inputs, map [min, max] onto the codes 0..15")


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """The weights that 4-bit group codes stand for.

    codes: (N, K) uint8 codes 0..15; scale, minimum: (N, K // G) float32, one per group of G consecutive
    inputs — G is K // scale.shape[1]. Do not modify them.
    Return a float32 tensor (N, K) with entry [n, k] = codes[n, k] * scale[n, k // G] + minimum[n, k // G].
    Example: codes [[0, 3, 6, 15, 0, 0, 0, 0]], scale [[0.5, 1.0]], minimum [[0.0, -1.0]] ->
    [[0.0, 1.5, 3.0, 7.5, -1.0, -1.0, -1.0, -1.0]].
    """
    raise NotImplementedError("ch12.dequantize_int4: each code times its group's scale, plus its group's minimum")
