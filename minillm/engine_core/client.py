"""ProcessAsyncLLM: `AsyncLLM`'s API (futures, streams, aborts, refusals) over an engine core process.

    llm = ProcessAsyncLLM(config=EngineConfig(max_num_seqs=32))   # starts the core; returns when it is ready
    out = await llm.submit("ROMEO:", params)
    llm.close()                                                    # or let the process exit: the core follows

This process (the front end) tokenizes, detokenizes and judges stop strings; the core process only
schedules, runs the model and samples (core.py). Messages go over two pipes (multiprocessing's
connections: pickled, no new dependency). The front end reads the core's steps from the event loop
(`add_reader` on the pipe), and sends from a thread of its own, so neither side can block the other.

If the core dies, every request in flight ends at once with finish_reason "error", `error` says why,
and new requests are refused with a RuntimeError (the core is not restarted: a server answers 503 and
its supervisor restarts it whole).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time

from minillm.async_engine import AsyncLLM, _Submission, running_loop
from minillm.config import EngineConfig
from minillm.disagg.kv_connector import KVTransfer
from minillm.engine_core.messages import (
    AbortRequest,
    AddRequest,
    CoreFailed,
    CoreReady,
    CoreStep,
    StartCore,
    StopSample,
)
from minillm.engine_core.output_processor import RequestState
from minillm.engine_core.process import CoreProcess
from minillm.model.loader import load_tokenizer
from minillm.prompts import encode_prompt
from minillm.sampling import SamplingParams
from minillm.timeline import Timeline, span

logger = logging.getLogger("minillm")



class ProcessAsyncLLM(AsyncLLM):
    """AsyncLLM whose engine runs in a process of its own (`threads`: the core's torch threads; `timeline`:
    record both sides' spans, the core's shipped back with its steps — chapter 10; off by default)."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None, threads: int | None = None,
                 timeline: Timeline | None = None, kv_transfer: KVTransfer | None = None):
        """`kv_transfer`: the core is the decode end of a disaggregated pair (chapter 13: minillm/disagg/)."""
        config = config if config is not None else EngineConfig()
        if not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        self._core = CoreProcess(StartCore(model, config, os.getpid(), threads, timeline is not None, kv_transfer))
        self._process, self._from_core, self._finalizer = self._core.process, self._core.from_core, self._core.stop
        self.timeline = timeline
        try:
            tokenizer = load_tokenizer(model)  # while the core loads the model
            ready = self._wait_until_ready()
        except BaseException:
            self._finalizer()
            raise
        self._front_end(tokenizer, ready.model_config, config, ready.max_model_len)
        self._live: dict[str, RequestState] = {}  # the core's request id -> the request
        self._core_id_of: dict[str, str] = {}  # the caller's request id -> the core's
        self._core_ids = itertools.count()
        self._reader_loop: asyncio.AbstractEventLoop | None = None
        self._gauges: dict[str, float] = {}
        self._error: str | None = None

    def _wait_until_ready(self) -> CoreReady:
        """The core's CoreReady, or its error (a front end over several cores waits for them all)."""
        return self._core.wait_until_ready()

    # ------------------------------------------------------------------ what the caller sees
    @property
    def error(self) -> str | None:
        return self._error

    @property
    def core_pid(self) -> int | None:
        return self._process.pid

    def gauges(self) -> dict[str, float]:
        """The engine's state after its latest step, as the core reported it."""
        return dict(self._gauges)

    def close(self) -> None:
        """Stop the core process (a clean shutdown, then a kill if it does not exit); requests in flight end
        with an error."""
        if self._error is None:
            self._core_gone("the engine was closed", log=False)
        self._finalizer()

    # ------------------------------------------------------------------ AsyncLLM's hooks
    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = running_loop()
        old = self._reader_loop
        if old is loop:
            return loop
        if old is not None:
            if old.is_running():
                raise RuntimeError("this AsyncLLM is serving an event loop in another thread: create one AsyncLLM "
                                   "per event loop")
            self._reclaim()
            if not old.is_closed():
                old.remove_reader(self._from_core.fileno())
        if self._error is None:
            loop.add_reader(self._from_core.fileno(), self._on_core_output)
        self._reader_loop = loop
        return loop

    def _reclaim(self) -> None:
        """Abort what an abandoned event loop left in flight (its futures belong to that loop)."""
        for core_id in list(self._live):
            self._send(AbortRequest(core_id))
        self._live, self._core_id_of = {}, {}
        self._pending, self._aborts, self._resolving = [], [], []

    def _ensure_running(self) -> None:
        """Hand new submissions and aborts to the core now (there is no loop of ours to wait for)."""
        pending, self._pending = self._pending, []
        for sub in pending:
            self._add(sub)
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            self._abort_now(request_id)

    def _new_request_id(self, n: int) -> str:
        taken = {sub.request_id for sub in (*self._pending, *self._resolving)}
        while (request_id := f"async-{next(self._ids)}") in self._core_id_of or request_id in taken:
            pass
        return request_id

    def _on_done(self, request_id: str, future: asyncio.Future) -> None:
        core_id = self._core_id_of.get(request_id)
        if future.cancelled() and core_id is not None and self._live[core_id].future is future:
            self.abort(request_id)

    def _add(self, sub: _Submission) -> None:
        with span(self.timeline, "receive"):
            self._receive(sub)

    def _receive(self, sub: _Submission) -> None:
        if sub.future.done():  # cancelled before it was handed on
            self._end_stream(sub.stream)
            return
        try:
            state = self._state(sub)
        except Exception as err:  # refused at the door
            sub.future.set_exception(err)
            self._end_stream(sub.stream)
            return
        self._live[state.core_id], self._core_id_of[state.request_id] = state, state.core_id
        self._hand_on(state)

    def _hand_on(self, state: RequestState) -> None:
        """Send a request accepted at the door to the core (a disaggregated router sends it to its prefill core
        first: minillm/disagg/router.py)."""
        self._send(AddRequest(state.core_id, state.prompt_token_ids, state.params, state.metrics.arrival_time))

    def _state(self, sub: _Submission) -> RequestState:
        """The front end's half of a new request; raises what LLMEngine.add_request would for what it can
        check here (the rest the core checks, and refuses with its reason)."""
        if self._error is not None:
            raise RuntimeError(f"the engine is not running: {self._error}")
        params = sub.params if sub.params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if sub.request_id in self._core_id_of:
            raise ValueError(f"request_id {sub.request_id!r} is already in use")
        params.check_vocab(self.model_config.vocab_size, self.model_config.eos_token_ids)
        ids = list(sub.prompt) if sub.text is not None else encode_prompt(
            self.tokenizer, sub.prompt, self.max_model_len, self.model_config.vocab_size)
        return RequestState(sub.request_id, str(next(self._core_ids)), sub.text, ids, params, self.tokenizer,
                            self.model_config.eos_token_ids, time.perf_counter(), sub.future, sub.stream)

    def _abort_now(self, request_id: str) -> bool:
        core_id = self._core_id_of.get(request_id)
        if core_id is None:
            return False
        self._send(AbortRequest(core_id))
        state = self._live[core_id]
        state.abort()
        self._deliver_state(state)
        return True

    # ------------------------------------------------------------------ the core's side
    def _send(self, message) -> None:
        if self._error is None:
            self._core.send(message)

    def _on_core_output(self) -> None:
        """The pipe from the core is readable: apply every step waiting (on the event loop)."""
        try:
            while self._from_core.poll():
                with span(self.timeline, "detokenize"):  # the core's output: text, stop strings, the callers' events
                    self._apply(self._from_core.recv())
        except (EOFError, OSError):
            self._core_gone(f"the engine core process ended (exit code {self._core.exit_code()})")
        except Exception:  # a defect of ours: said, and the loop goes on
            logger.exception("the front end could not apply the engine core's output")

    def _apply(self, step: CoreStep | CoreFailed) -> None:
        if isinstance(step, CoreFailed):  # the core has stopped, and says why
            self._core_gone(str(step.error))
            return
        if step.spans and self.timeline is not None:
            self.timeline.extend(step.spans)
        if step.gauges:
            self._gauges = step.gauges
        for refused in step.refused:
            state = self._live.get(refused.request_id)
            if state is not None:
                self._forget(state)
                if not state.future.done():
                    state.future.set_exception(ValueError(refused.error))
                self._end_stream(state.stream)
        for tokens in step.samples:
            state = self._live.get(tokens.request_id)
            if state is None:  # aborted or ended here already
                continue
            event, stopped = state.add(tokens, step.time)
            if state.stream is not None and event is not None:
                state.stream.put_nowait(event)
            if state.error is not None:  # its text could not be decoded: the whole request fails
                self._send(AbortRequest(state.core_id))
            elif stopped and not state.done:
                self._send(StopSample(state.sample_id(tokens.index)))
            elif stopped:  # its last sample: the whole request can go
                self._send(AbortRequest(state.core_id))
            if state.done:
                self._deliver_state(state)
        for done in step.done:
            state = self._live.get(done.request_id)
            if state is None:
                continue
            for event in state.end(done):
                if state.stream is not None:
                    state.stream.put_nowait(event)
            self._deliver_state(state)

    def _forget(self, state: RequestState) -> None:
        self._live.pop(state.core_id, None)
        if self._core_id_of.get(state.request_id) == state.core_id:
            del self._core_id_of[state.request_id]

    def _deliver_state(self, state: RequestState) -> None:
        self._forget(state)
        if not state.future.done():
            state.future.set_result(state.output())
        self._end_stream(state.stream)

    def _core_gone(self, why: str, log: bool = True) -> None:
        """The core is gone: every request in flight ends now with an error, new ones are refused."""
        if self._error is not None:
            return
        if log:
            logger.error("%s: its requests end with an error", why)
        self._error = why
        if self._reader_loop is not None and not self._reader_loop.is_closed():
            self._reader_loop.remove_reader(self._from_core.fileno())
        for state in list(self._live.values()):
            state.fail(why)
            self._deliver_state(state)
        for sub in [*self._pending, *self._resolving]:
            if not sub.future.done():
                sub.future.set_exception(RuntimeError(f"the engine is not running: {why}"))
            self._end_stream(sub.stream)
        self._pending, self._aborts = [], []
