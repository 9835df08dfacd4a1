"""The contract between the model's attention layers and the place K/V are stored."""

from __future__ import annotations

from typing import Protocol

import torch


class AttentionBackend(Protocol):
    """One forward pass's view of the KV storage.

    A backend object is built per forward pass from that pass's metadata (which sequences are in
    the flat batch, how many tokens each brings, where their cached K/V live). Each layer calls
    `attend` once: the backend stores the new K/V and returns the attention output.
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim) of the
        new tokens. Returns (num_tokens, num_heads, head_dim)."""
        ...
