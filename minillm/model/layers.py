"""The decoder's small building blocks: RMSNorm and the gated (SwiGLU) MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm.model.linear import Linear


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, computed in float32 like the reference implementations."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)  # x / sqrt(mean(x²) + eps)
        return self.weight * normed.to(x.dtype)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up are one fused matmul (`gate_up_proj`)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # 2 × (num_tokens, inter)
        return self.down_proj(F.silu(gate) * up)
