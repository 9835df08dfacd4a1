"""Solution of `ch01.top_p`."""

import torch


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1)  # ascending
    mass_at_or_below = probs.cumsum(dim=-1)  # probability of this token and every less likely one
    drop = mass_at_or_below <= 1 - top_p
    drop[..., -1] = False  # the most likely token always stays
    drop_in_vocab_order = torch.zeros_like(drop).scatter(-1, order, drop)
    return logits.masked_fill(drop_in_vocab_order, float("-inf"))
