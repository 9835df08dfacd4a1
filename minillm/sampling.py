"""Sampling parameters, and how one next token is chosen from (processed) logits.

    logits ─► / temperature ─► top-k ─► top-p ─► min-p ─► softmax ─► draw (seeded)   temperature >= 1e-5
    logits ─► argmax                                                                temperature < 1e-5

The filters follow Hugging Face's logits warpers exactly (same order, same tie and boundary rules),
so minillm and `transformers.generate` agree on which tokens stay in play. What happens to the
logits before these filters (bias, penalties, min_tokens) is `minillm/logits_processors.py`; the
batched sampler that runs it all for a whole step is `minillm/sampler.py`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from minillm.structured.constraint import StructuredOutput

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


MAX_LOGPROBS = 20  # top alternatives a request may ask for per token (OpenAI's and vLLM's default limit)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


@dataclass(frozen=True)
class SamplingParams:
    """How to generate for one request. `temperature=0` (or below `SAMPLING_EPS`) is greedy decoding.

    Every field is checked here, so nothing a request asks for can fail later inside an engine
    step: a bad value raises ValueError naming the field and its allowed range (vLLM's ranges).
    How the logits become a token, in this order (`minillm/sampler.py`):

        raw logits ─► logprobs reported (the model's own log-softmax)
                   ─► logit_bias ─► repetition, frequency, presence penalties ─► min_tokens mask
                   ─► the structured output's mask (tokens its grammar refuses next: -inf)
                   ─► argmax (greedy)  or  / temperature ─► top-k ─► top-p ─► min-p ─► draw (seeded)
    """

    temperature: float = 1.0
    top_k: int | None = None  # keep the k most likely tokens; None keeps all
    top_p: float = 1.0  # keep the smallest set whose probability reaches top_p
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one's probability
    max_new_tokens: int = 64
    min_tokens: int = 0  # no EOS or stop token (nor stop string) before this many new tokens
    stop: tuple[str, ...] = ()  # stop strings; the text is cut before the earliest one
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False  # keep the stop string at the end of the text
    ignore_eos: bool = False
    skip_special_tokens: bool = True  # leave special tokens (EOS...) out of the text
    seed: int | None = None
    n: int = 1  # independent samples of the same prompt, which is computed once (their blocks shared)
    presence_penalty: float = 0.0  # subtracted from a token's logit once it appeared in the output
    frequency_penalty: float = 0.0  # subtracted once per time a token appeared in the output
    repetition_penalty: float = 1.0  # a token of the prompt or output: positive logit / p, negative x p
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); a dict is accepted
    logprobs: int | None = None  # report each new token's logprob and this many most likely alternatives
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has none); such a request
    #                                     computes its whole prompt: a prefix-cache hit would skip positions
    structured: StructuredOutput | None = None  # the output must match it (chapter 11): a JSON schema, a regex,
    #                                             a choice, a grammar — a dict of StructuredOutput's fields works

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias", tuple(self.logit_bias.items()))
        for name in ("stop", "stop_token_ids", "logit_bias"):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise ValueError(f"{name} must be a list or tuple, got {type(value).__name__}")
            object.__setattr__(self, name, tuple(value))
        _check_number("temperature", self.temperature, 0.0, 100.0, "(0 = greedy)")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        _check_number("min_p", self.min_p, 0.0, 1.0)
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_new_tokens={self.max_new_tokens}], got "
                             f"{self.min_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if any(not is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold token ids >= 0, got {self.stop_token_ids!r}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not is_bool(getattr(self, name)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer in [0, 2**64 - 1] or None, got {self.seed!r}")
        if not is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        _check_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if not _is_number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be a number in (0, 2] (1 = none), got "
                             f"{self.repetition_penalty!r}")
        for pair in self.logit_bias:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and is_int(pair[0]) and pair[0] >= 0
                    and _is_number(pair[1]) and (is_int(pair[1]) or math.isfinite(pair[1]))
                    and abs(pair[1]) <= MAX_LOGIT_BIAS):  # an int of any size compares exactly, never overflows
                raise ValueError(f"logit_bias must map token ids >= 0 to numbers in [-{MAX_LOGIT_BIAS:g}, "
                                 f"{MAX_LOGIT_BIAS:g}], got {pair!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] or None, got {value!r}")
        if self.structured is not None:
            object.__setattr__(self, "structured", StructuredOutput.coerce(self.structured))
            if self.min_tokens > 0:  # once the grammar is complete only EOS is allowed, which min_tokens masks
                raise ValueError("min_tokens cannot be combined with a structured output: the grammar decides "
                                 "where the output ends")
            if self.ignore_eos:  # ...and the output ends there whatever ignore_eos says
                raise ValueError("ignore_eos cannot be combined with a structured output: the grammar decides "
                                 "where the output ends (once it is complete, it allows only EOS)")
        # numpy scalars become plain Python values: equal params compare and hash equal
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("max_new_tokens", "min_tokens", "n"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", tuple(sorted({int(t): float(b) for t, b in self.logit_bias}.items())))
        for name in ("top_k", "seed", "logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def has_penalties(self) -> bool:
        """Whether a token's logit depends on the tokens already seen (the sampler then counts them)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def changes_logits(self) -> bool:
        """Whether anything before temperature changes the model's logits: a bias, a penalty, min_tokens."""
        return self.has_penalties or bool(self.logit_bias) or self.min_tokens > 0

    def check_vocab(self, vocab_size: int, eos_token_ids: Iterable[int] = ()) -> None:
        """What the parameters ask of a model's vocabulary must be possible (ValueError if not): the token
        ids logit_bias names exist, and min_tokens leaves some token to draw (its stop tokens and EOS are
        masked until then)."""
        outside = [t for t, _ in self.logit_bias if t >= vocab_size]
        if outside:
            raise ValueError(f"logit_bias names token id {outside[0]}, outside the vocabulary [0, {vocab_size})")
        masked = set(self.stop_token_ids) | (set() if self.ignore_eos else set(eos_token_ids))
        if self.min_tokens > 0 and len(masked & set(range(vocab_size))) == vocab_size:
            raise ValueError(f"min_tokens={self.min_tokens} masks every stop token until then, and stop_token_ids "
                             f"(with EOS) cover the whole vocabulary of {vocab_size}: no token could be drawn")

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A generator seeded with `seed` (None: the global RNG); one per request (per sample)."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)

    def for_sample(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of n: one sample each, sample 0 with `seed` itself, the
        others with seeds derived from it (so the same request gives the same n texts)."""
        if not 0 <= index < self.n:
            raise ValueError(f"sample index must be in [0, {self.n}), got {index!r}")
        seed = self.seed if self.seed is None or index == 0 else sample_seed(self.seed, index)
        return dataclasses.replace(self, n=1, seed=seed)


def sample_seed(seed: int, index: int) -> int:
    """Sample `index`'s seed, derived from the request's: splitmix64 of (seed, index), so neighbouring
    seeds and neighbouring samples give unrelated streams."""
    z = (seed + index * 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def _check_number(name: str, value, low: float, high: float, note: str = "") -> None:
    if not _is_number(value) or not low <= value <= high:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}]{' ' + note if note else ''}, got {value!r}")


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


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop every token whose probability is below min_p times the most likely token's (as HF's
    MinPLogitsWarper; the most likely token always stays). logits: (..., vocab)."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p (HF's order). logits: (vocab,) or (n, vocab), float32."""
    logits = logits / params.temperature
    if params.top_k is not None:
        logits = top_k_filter(logits, params.top_k)
    return min_p_filter(top_p_filter(logits, params.top_p), params.min_p)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One token id from one row of already processed logits (vocab,): argmax, or a seeded draw
    after temperature and the filters. The engine samples whole batches in `minillm/sampler.py`."""
    if params.greedy:
        return int(logits.argmax())
    probs = filtered_logits(logits.float(), params).softmax(dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
