"""The contract between the model's attention layers and the place K/V are stored."""

from __future__ import annotations

from collections.abc import Sequence
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


def token_positions(starts: Sequence[int], query_lens: Sequence[int], device) -> torch.Tensor:
    """(sum(query_lens),) int64: the positions of one pass's new tokens — sequence i's run
    starts[i], starts[i] + 1, ... of query_lens[i] — built without a Python loop over the tokens.

        starts [7, 0, 3], query_lens [1, 4, 1]  ->  [7, 0, 1, 2, 3, 3]"""
    start = torch.tensor(starts, dtype=torch.long, device=device)
    if all(n == 1 for n in query_lens):  # a pure decode pass: one token at each start
        return start
    lens = torch.tensor(query_lens, dtype=torch.long, device=device)
    first_row = torch.cumsum(lens, 0) - lens  # where each sequence's run begins in the flat batch
    return torch.arange(int(lens.sum()), device=device) + torch.repeat_interleave(start - first_row, lens)
