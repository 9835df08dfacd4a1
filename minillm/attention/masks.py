"""Attention masks as the 0 / -inf bias attention adds to its scores, built once per forward pass
(not again in every layer)."""

from __future__ import annotations

import torch


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" mask -> 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))

