"""The front end's half of a request whose tokens come from an engine core in another process.

Per sample it keeps the tokens delivered so far and their text: each token the core sends is
detokenized once here, and stop strings are looked for here, where the text is. When one ends a
sample, the tokens after it (the core may have made one or two more before it hears) are dropped
and the caller is told to stop that sample in the core. The result equals what `LLMEngine` gives
in one process, token for token (tests/test_engine_core.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from minillm.async_engine import StreamEvent
from minillm.detokenizer import IncrementalDetokenizer
from minillm.engine import CompletionOutput, RequestOutput
from minillm.engine_core.messages import RequestDone, SampleTokens
from minillm.logprobs import TokenLogprob
from minillm.metrics import RequestMetrics
from minillm.sampling import SamplingParams


@dataclass
class SampleText:
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class RequestState:
    """One request in flight, as the front end sees it: what its caller awaits, and its samples' text."""

    def __init__(self, request_id: str, core_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, tokenizer, eos_token_ids: Collection[int], arrival_time: float,
                 future: asyncio.Future, stream: asyncio.Queue | None):
        self.request_id, self.core_id = request_id, core_id
        self.prompt, self.prompt_token_ids = prompt, prompt_token_ids
        self.params, self.eos_token_ids, self.future, self.stream = params, eos_token_ids, future, stream
        self.samples = [SampleText(IncrementalDetokenizer.for_request(tokenizer, prompt_token_ids, params))
                        for _ in range(params.n)]
        self.metrics = RequestMetrics(arrival_time)  # sample 0's, as LLMEngine's outputs give
        self.num_cached_tokens = 0
        self.prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        self.error: str | None = None

    def sample_id(self, index: int) -> str:
        """The core's id of sample `index` (LLMEngine's naming)."""
        return self.core_id if index == 0 else f"{self.core_id}#{index}"

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    def add(self, tokens: SampleTokens, now: float) -> tuple[StreamEvent | None, bool]:
        """Take a step's tokens for one sample, one by one as LLMEngine does. Returns the stream's event
        (None if the sample had already ended here) and whether a stop string ended the sample just now.
        A token the tokenizer cannot decode fails the whole request (`error` is set; every sample ends)."""
        sample = self.samples[tokens.index]
        if sample.finish_reason is not None:  # the core's tokens after a stop string: not the request's
            return None, False
        if tokens.num_cached_tokens is not None:
            self.num_cached_tokens = tokens.num_cached_tokens
        if tokens.prompt_logprobs is not None:
            self.prompt_logprobs = tokens.prompt_logprobs
        before, text, stopped = len(sample.token_ids), "", False
        for k, token in enumerate(tokens.token_ids):
            sample.token_ids.append(token)
            if tokens.logprobs:
                sample.logprobs.append(tokens.logprobs[k])
            if tokens.index == 0:
                self.metrics.record_token(now)
            try:
                text += sample.detokenizer.push_output(sample.token_ids, self.params, self.eos_token_ids)
                stopped = sample.detokenizer.stopped_by is not None
                if stopped or (k == len(tokens.token_ids) - 1 and tokens.finish_reason is not None):
                    text += sample.detokenizer.flush()
            except Exception as err:  # as LLMEngine: this request alone fails
                self.fail(f"{type(err).__name__}: {err}")
                return self._event(tokens.index, text, before), False
            if stopped:
                break
        sample.finish_reason = "stop" if stopped else tokens.finish_reason
        return self._event(tokens.index, text, before), stopped

    def end(self, done: RequestDone) -> list[StreamEvent]:
        """The core let the request go: samples not ended here end with its reasons (an error's text)."""
        if done.error is not None:
            self.error = done.error
        events = []
        for index, (sample, reason) in enumerate(zip(self.samples, done.finish_reasons)):
            if sample.finish_reason is None:
                sample.finish_reason = reason or "abort"
                events.append(self._event(index, "", len(sample.token_ids)))
        return events

    def fail(self, error: str) -> None:
        """A failed request fails whole, as LLMEngine.fail: every sample not yet ended ends with "error"."""
        self.error = error
        for sample in self.samples:
            if sample.finish_reason is None:
                sample.finish_reason = "error"

    def abort(self) -> None:
        for sample in self.samples:
            if sample.finish_reason is None:
                sample.finish_reason = "abort"

    def _event(self, index: int, delta: str, before: int) -> StreamEvent:
        sample = self.samples[index]
        prompt_logprobs = self.prompt_logprobs if index == 0 and before == 0 and sample.token_ids else None
        return StreamEvent(index, delta, tuple(sample.token_ids[before:]), tuple(sample.logprobs[before:]),
                           sample.finish_reason, sum(len(s.token_ids) for s in self.samples), prompt_logprobs)

    def output(self) -> RequestOutput:
        logprobs = self.params.logprobs is not None
        if self.metrics.finish_time is None:
            self.metrics.finish_time = time.perf_counter()
        outputs = [CompletionOutput(i, s.detokenizer.text, list(s.token_ids), s.finish_reason,
                                    list(s.logprobs) if logprobs else None) for i, s in enumerate(self.samples)]
        prompt_logprobs = list(self.prompt_logprobs) if self.params.prompt_logprobs is not None and \
            self.prompt_logprobs is not None else None
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, self.metrics, self.error,
                             self.num_cached_tokens, prompt_logprobs)
