"""The attention layer: project to q, k, v, rotate, let the backend attend, project back.

The layer owns the weights; *where* K and V live (no cache, a contiguous cache, paged blocks) is
the backend's business, passed in on every call. The model never reads a global batch context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minillm.attention.backend import AttentionBackend
from minillm.model import fused_cpu
from minillm.model.config import ModelConfig
from minillm.model.layers import RMSNorm
from minillm.model.linear import Linear
from minillm.model.rope import Rotation

if TYPE_CHECKING:
    from minillm.distributed.communicator import Communicator


class SelfAttention(nn.Module):
    """`config` gives this rank's heads: under tensor parallelism (chapter 13) the layer holds its rank's
    query and KV heads, and `communicator` sums the ranks' partial o_proj outputs."""

    def __init__(self, config: ModelConfig, layer_index: int, communicator: Communicator | None = None):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = config.head_dim**-0.5
        # q, k and v in one matmul: rows [0, q_size) are q, then k, then v.
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        # row-parallel under tensor parallelism: each rank's output is a partial sum; its bias is added once
        self.o_proj = Linear(self.q_size, config.hidden_size,
                             bias=config.o_bias and (communicator is None or communicator.rank == 0))
        self.communicator = communicator
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, rotation: Rotation, backend: AttentionBackend) -> torch.Tensor:
        """x: (num_tokens, hidden) -> (num_tokens, hidden)."""
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # (num_tokens, q_size + 2 * kv_size)
        rotated = self.q_norm is None and fused_cpu.usable(qkv, rotation.cos)
        if rotated:  # q's heads and k's, side by side in each row: rotated in place, in one pass
            fused_cpu.rope_(qkv, rotation.cos, rotation.signed_sin, self.num_heads + self.num_kv_heads,
                            self.head_dim)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)  # (num_tokens, num_heads, head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if not rotated:
            q, k = rotation.apply(q, k)
        out = backend.attend(self.layer_index, q, k, v, self.scale)  # (num_tokens, num_heads, head_dim)
        out = self.o_proj(out.reshape(n, self.q_size))  # (num_tokens, hidden)
        if self.communicator is not None:  # the sum over the ranks' heads
            self.communicator.all_reduce_(out)
        return out
