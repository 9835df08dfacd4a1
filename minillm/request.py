"""One request's life: its input, its changing state, and its output.

    WAITING ──admit──► RUNNING ──EOS / length / stop──► FINISHED
       ▲                  │
    PREEMPTED ◄─preempt───┘ (chapter 4: out of KV blocks; it waits first in line, then recomputes)
                                                  any live state ──abort──► ABORTED
                                                  any live state ──error──► FAILED (its step failed)

The fields fall in three groups, filled at three moments: the **input** when the request is
submitted, the **state** while the engine runs it, the **output** when it ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from minillm.logprobs import TokenLogprob
from minillm.metrics import RequestMetrics
from minillm.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # its KV was freed; back in the queue, it recomputes everything it had
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"  # a step raised while running it: it ends alone, with the error's text

    @property
    def is_done(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED)


@dataclass(eq=False)
class Request:
    # --- input: given at submission -------------------------------------------------------------
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    prompt: str | None = None
    future: Any = None  # an asyncio.Future resolved with the RequestOutput (the async API sets it)
    parent: Request | None = None  # sample i > 0 of a request with n samples: the request it forks from
    sample_index: int = 0
    children: list[Request] = field(default_factory=list)  # samples 1 .. n-1, forked when the prompt is done

    # --- state: changed by the scheduler and the engine ------------------------------------------
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    slot: int | None = None  # its batch slot while RUNNING: with a contiguous cache also its KV
    #                          location; with a paged cache its blocks are the block pool's table under its id
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission (chapter 5)
    max_guesses: int = 0  # the most guesses it may verify this step, offered before scheduling (chapter 7)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per prompt token, as computed
    grammar: Any = None  # a structured output's compiled grammar, as a Future while it compiles (chapter 11)
    matcher: Any = None  # ...and once compiled, this sample's walk through it (minillm/structured/grammars.py)

    # --- output: filled as it produces tokens and when it ends -----------------------------------
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # what went wrong, when finish_reason == "error"
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when asked for
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end], without building the whole list (the scheduler asks every step)."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        if end <= n:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def room_for_guesses(self, k: int, max_model_len: int) -> int:
        """Speculative decoding: how many of `k` guesses this decoding request may verify — never past
        its max_new_tokens or the context (the target's own token comes on top)."""
        return min(k, self.params.max_new_tokens - self.num_output_tokens - 1, max_model_len - self.num_tokens)

    @property
    def is_ready(self) -> bool:
        """Whether it may be admitted: a request with a structured output waits until its grammar is
        compiled (and its matcher made)."""
        return self.grammar is None or self.matcher is not None

    @property
    def samples(self) -> list[Request]:
        """All n samples: this request, then the children forked from it."""
        return [self, *self.children]

    @property
    def is_fork_pending(self) -> bool:
        """A child not forked yet: it waits, holding a reserved slot once its parent is admitted,
        for its parent's prompt to be computed."""
        return self.parent is not None and self.status is RequestStatus.WAITING

    @property
    def pending_forks(self) -> list[Request]:
        return [c for c in self.children if c.is_fork_pending]

    @property
    def wants_prompt_logits(self) -> bool:
        """Whether some prompt token still needs its logprob, so no prompt position may be skipped
        (a prefix-cache hit would skip computing them)."""
        return (self.parent is None and self.params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens)  # a forked sample shares its parent's

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to be run through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def ttft(self) -> float | None:
        return self.metrics.ttft

    @property
    def tpot(self) -> float | None:
        return self.metrics.tpot
