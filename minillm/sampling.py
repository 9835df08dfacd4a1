"""Sampling: how one next token is chosen from the logits.

    logits ─► / temperature ─► top-k ─► top-p ─► softmax ─► draw (seeded)      temperature >= 1e-5
    logits ─► argmax                                                          temperature < 1e-5

The filters follow Hugging Face's logits warpers exactly (same order, same tie and boundary rules),
so minillm and `transformers.generate` agree on which tokens stay in play.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import torch

SAMPLING_EPS = 1e-5
"""Temperatures below this are greedy: dividing logits by a smaller one overflows float32, and
sampling that sharp is argmax anyway (vLLM draws the same line)."""

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits


def is_int(value) -> bool:
    """An integer (Python's or numpy's), but not a bool: True is an int to Python, not to us."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_bool(value) -> bool:
    """True or False, Python's or numpy's (np.bool_ is no subclass of bool)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ == "bool")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to generate for one request. `temperature=0` (or below `SAMPLING_EPS`) is greedy decoding.

    Every field is checked here, so nothing a request asks for can fail later inside an engine
    step: a bad value raises ValueError naming the field and its allowed range.
    """

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
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise ValueError(f"{name} must be a list or tuple, got {type(value).__name__}")
            object.__setattr__(self, name, tuple(value))
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be a number in [0, 100] (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if any(not is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold token ids >= 0, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer in [0, 2**64 - 1] or None, got {self.seed!r}")
        # numpy scalars become plain Python numbers: equal params compare and hash equal
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        for name in ("top_k", "seed"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

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
