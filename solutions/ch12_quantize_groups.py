"""Solution of `ch12.quantize_int4` and `ch12.dequantize_int4`."""

import torch


def quantize_groups(weight, group_size):
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)  # consecutive inputs share a group
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = torch.where(high > low, (high - low) / 15, torch.ones_like(low))  # a constant group is exact anyway
    codes = torch.clamp(torch.round((w - low[..., None]) / scale[..., None]), 0, 15).to(torch.uint8)
    return codes.reshape(n, k), scale, low


def dequantize_groups(codes, scale, minimum):
    n, k = codes.shape
    groups = scale.shape[1]
    w = codes.float().reshape(n, groups, k // groups) * scale.float()[..., None] + minimum.float()[..., None]
    return w.reshape(n, k)
