"""Attention masks as the 0 / -inf bias attention adds to its scores, built once per forward pass
(not again in every layer)."""

from __future__ import annotations

import torch


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" mask -> 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


def prefill_mask(start: int, num_tokens: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(num_tokens, start + num_tokens): new token j, at absolute position start + j, sees keys 0..start + j."""
    causal = torch.ones(num_tokens, start + num_tokens, dtype=torch.bool, device=device).tril(diagonal=start)
    return additive_mask(causal, dtype)
