"""Rotary position embeddings (RoPE), with the scaling variants of Llama and Qwen checkpoints.

Each pair of channels (i, i + head_dim/2) of q and k is rotated by the angle position · inv_freq[i].
Scaling variants only change `inv_freq` (and, for YaRN, multiply cos/sin by an attention factor):

    default  inv_freq[i] = theta^(-2i/d)
    linear   inv_freq / factor                      (positions interpolated)
    llama3   low frequencies / factor, high kept, a smooth blend in between
    yarn     per-frequency blend of interpolation and extrapolation, cos/sin × mscale
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from minillm.model.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq of shape (head_dim / 2,), attention factor applied to cos and sin)."""
    dim, base = config.head_dim, config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / scaling["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(dim, base, scaling, config.max_position_embeddings)
    raise ValueError(f"unsupported rope_type {rope_type!r}")


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, blended, scaled)


def _yarn(dim: int, base: float, scaling: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    old_len = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_positions / old_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for every position; `forward` rotates q and k in place of HF's."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        shape = (config.max_position_embeddings, config.head_dim)
        self.register_buffer("cos", torch.empty(shape), persistent=False)
        self.register_buffer("sin", torch.empty(shape), persistent=False)
        self.compute_tables()

    @torch.no_grad()
    def compute_tables(self) -> None:
        """Fill cos/sin (in float32, then the buffers' dtype); call again after `to_empty()`."""
        inv_freq, attention_factor = inverse_frequencies(self.config)
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # (max_positions, head_dim / 2)
        angles = torch.cat([freqs, freqs], dim=-1)  # (max_positions, head_dim)
        if self.cos.device.type != "meta":
            self.cos.copy_(angles.cos() * attention_factor)
            self.sin.copy_(angles.sin() * attention_factor)

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotation:
        """The rotation for these positions (num_tokens,): computed once per forward pass, applied in every layer."""
        cos = self.cos[positions].unsqueeze(1).to(dtype)  # (num_tokens, 1, head_dim)
        sin = self.sin[positions].unsqueeze(1).to(dtype)
        half = sin.shape[-1] // 2
        return Rotation(cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: (num_tokens,); q: (num_tokens, num_heads, head_dim); k: (num_tokens, kv_heads, head_dim)."""
        return self.at(positions, q.dtype).apply(q, k)


@dataclass(frozen=True)
class Rotation:
    """RoPE for one batch of positions. Rotating pairs (x1, x2) of the two halves of head_dim:

        x * cos + rotate_half(x) * sin,  rotate_half(x1, x2) = (-x2, x1)
      = x * cos + roll(x, half) * (-sin₁, sin₂)          (one roll instead of two slices, a negation and a cat)
    """

    cos: torch.Tensor  # (num_tokens, 1, head_dim)
    signed_sin: torch.Tensor  # (num_tokens, 1, head_dim): the first half negated

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = q.shape[-1] // 2
        return (q * self.cos + q.roll(half, dims=-1) * self.signed_sin,
                k * self.cos + k.roll(half, dims=-1) * self.signed_sin)
