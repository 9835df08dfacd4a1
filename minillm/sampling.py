"""Sampling: how one next token is chosen from the logits.

    logits ─► / temperature ─► top-k ─► top-p ─► softmax ─► draw (seeded)      temperature > 0
    logits ─► argmax                                                          temperature = 0

The filters follow Hugging Face's logits warpers exactly (same order, same tie and boundary rules),
so minillm and `transformers.generate` agree on which tokens stay in play.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to generate for one request. `temperature=0` is greedy decoding."""

    temperature: float = 1.0
    top_k: int | None = None  # keep the k most likely tokens; None keeps all
    top_p: float = 1.0  # keep the smallest set whose probability reaches top_p
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()  # stop strings; the text is cut before the first one
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100] (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold token ids >= 0, got {self.stop_token_ids!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A generator seeded with `seed` (None: the global RNG); one per request."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the k-th largest to -inf (ties with the k-th are kept, as HF does).
    logits: (..., vocab)."""
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the most likely tokens until their probability reaches p.

    Sorted ascending, a token is dropped when the probability of it and every less likely token
    sums to at most 1 - p; the token that crosses the boundary stays, and so does the top token.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - p)
    drop_sorted[..., -1:] = False  # always keep the most likely token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (HF's order). logits: (vocab,) or (n, vocab), float32."""
    logits = logits / params.temperature
    if params.top_k is not None:
        logits = top_k_filter(logits, params.top_k)
    return top_p_filter(logits, params.top_p)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One token id from one row of logits (vocab,)."""
    if params.greedy:
        return int(logits.argmax())
    probs = filtered_logits(logits.float(), params).softmax(dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams],
                 generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token per row of (n, vocab) logits: greedy rows in one argmax, the rest row by row
    with their own generators, so a request's draws never depend on its neighbours."""
    greedy_ids = logits.argmax(dim=-1).tolist()
    return [g if p.greedy else sample(row, p, gen)
            for g, row, p, gen in zip(greedy_ids, logits, params, generators)]
