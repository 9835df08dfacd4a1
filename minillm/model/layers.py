"""The decoder's small building blocks: RMSNorm and the gated (SwiGLU) MLP.

On a CPU in float32 both run fused C kernels (minillm/model/fused_cpu.py) where they can; the torch
code below is what they compute, and what runs everywhere else."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from minillm.model import fused_cpu
from minillm.model.linear import Linear

if TYPE_CHECKING:
    from minillm.distributed.communicator import Communicator


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, computed in float32 like the reference implementations."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_cpu.usable(x, self.weight):
            return fused_cpu.rms_norm(x, self.weight, self.eps)[0]
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)  # x / sqrt(mean(x²) + eps)
        return self.weight * normed.to(x.dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): a residual connection and the norm after it, in one pass."""
        if fused_cpu.usable(x, residual, self.weight):
            return fused_cpu.rms_norm(x, self.weight, self.eps, residual)
        summed = residual + x
        return self(summed), summed


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up are one fused matmul (`gate_up_proj`). Under tensor
    parallelism (chapter 13) `intermediate_size` is this rank's rows, and `communicator` sums the ranks'
    partial down_proj outputs."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, communicator: Communicator | None = None):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size,
                                bias=bias and (communicator is None or communicator.rank == 0))  # added once
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (num_tokens, 2 * inter)
        if fused_cpu.usable(gate_up):
            out = self.down_proj(fused_cpu.silu_mul(gate_up))
        else:
            gate, up = gate_up.split(self.intermediate_size, dim=-1)  # 2 × (num_tokens, inter)
            out = self.down_proj(F.silu(gate) * up)  # (num_tokens, hidden)
        if self.communicator is not None:  # the sum over the ranks' rows
            self.communicator.all_reduce_(out)
        return out
