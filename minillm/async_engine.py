"""AsyncLLM: submit requests at any time and get an awaitable future back at once.

    fut = llm.submit("ROMEO:", params)          # returns immediately
    ...                                          # submit more, from anywhere in the event loop
    out = await fut                              # resolved when the request finishes

    async for delta in llm.stream("JULIET:", params):   # text as it is generated
        print(delta, end="")

One background task runs the engine loop while there is work. Each step runs in a worker thread,
so the event loop (Jupyter's included) stays responsive; submissions and aborts are queued and
applied between steps, so the engine itself is only ever touched by one step at a time.

Cancellation is abort: cancelling a future (or a timeout around it, `asyncio.wait_for`), or leaving
a stream early, aborts the request, and its KV is free before the next step. The loop never dies
of one request: a refused request's future raises its ValueError, a failed one resolves with
finish_reason "error", and later submissions are served.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from minillm.config import EngineConfig
from minillm.engine import LLMEngine, RequestOutput
from minillm.model.loader import load
from minillm.sampling import SamplingParams

logger = logging.getLogger("minillm")


@dataclass
class _Submission:
    request_id: str
    prompt: str | Sequence[int]
    params: SamplingParams | None
    future: asyncio.Future
    stream: asyncio.Queue | None  # text deltas, then None at the end


class AsyncLLM:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 engine: LLMEngine | None = None):
        if engine is None:
            config = config if config is not None else EngineConfig()
            net, tokenizer = load(model, dtype=config.dtype, device=config.device)
            engine = LLMEngine(net, tokenizer, config)
        self.engine = engine
        self._pending: list[_Submission] = []
        self._aborts: list[str] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._ids = itertools.count()
        self._loop_task: asyncio.Task | None = None

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None) -> asyncio.Future:
        """Queue a request; the returned future resolves to its RequestOutput (or raises the
        ValueError that refused it). Cancelling the future aborts the request. Must be called from
        the event loop's thread, in a running loop."""
        return self._enqueue(prompt, params, request_id, stream=None)

    async def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                     request_id: str | None = None) -> AsyncIterator[str]:
        """Yield the request's text deltas as the engine produces them. Leaving early (`break`, a
        cancelled task) aborts the request; a refused request raises its ValueError, a failed one a
        RuntimeError with the error, after the text it produced."""
        queue: asyncio.Queue = asyncio.Queue()
        future = self._enqueue(prompt, params, request_id, stream=queue)
        try:
            while (delta := await queue.get()) is not None:
                yield delta
        finally:
            if not future.done():  # the consumer left before the end
                future.cancel()
        output: RequestOutput = future.result()  # raises the ValueError of a refused request
        if output.finish_reason == "error":
            raise RuntimeError(f"request {output.request_id!r} failed: {output.error}")

    def abort(self, request_id: str) -> None:
        """Abort a submitted request; its future resolves with finish_reason "abort"."""
        self._aborts.append(request_id)
        self._ensure_running()

    def _enqueue(self, prompt, params, request_id, stream) -> asyncio.Future:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("AsyncLLM needs a running event loop (await it from async code, or use LLM for "
                               "plain synchronous calls)") from None
        future = loop.create_future()
        if request_id is None:
            request_id = f"async-{next(self._ids)}"
        self._pending.append(_Submission(request_id, prompt, params, future, stream))
        future.add_done_callback(lambda f: f.cancelled() and self.abort(request_id))
        self._ensure_running()
        return future

    def _ensure_running(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def _apply_queued(self) -> None:
        """Between steps: admit new submissions, apply aborts (the engine is idle now)."""
        pending, self._pending = self._pending, []
        for sub in pending:
            if sub.future.done():  # cancelled before it was admitted
                self._end_stream(sub.request_id, sub.stream)
                continue
            try:
                request = self.engine.add_request(sub.prompt, sub.params, request_id=sub.request_id)
            except Exception as err:  # refused at the door, whatever the type: this request's error alone
                sub.future.set_exception(err)
                self._end_stream(sub.request_id, sub.stream)
                continue
            request.future = sub.future  # the request owns its future (its input field group)
            if sub.stream is not None:
                self._streams[sub.request_id] = sub.stream
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            if self.engine.abort(request_id):
                self._deliver(request_id)

    def _deliver(self, request_id: str) -> None:
        request = self.engine.requests[request_id]
        output: RequestOutput = self.engine.output(request_id)
        self.engine.release(request_id)
        if request.future is not None and not request.future.done():
            request.future.set_result(output)
        self._end_stream(request_id, self._streams.pop(request_id, None))

    @staticmethod
    def _end_stream(request_id: str, stream: asyncio.Queue | None) -> None:
        if stream is not None:
            stream.put_nowait(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._apply_queued()
            if not self.engine.has_unfinished():
                return
            step = loop.run_in_executor(None, self.engine.step)
            try:
                updates = await asyncio.shield(step)
            except asyncio.CancelledError:  # the event loop is shutting down: nobody will await these
                await asyncio.wait([step])  # the step in flight finishes first; the engine is ours again
                self._end_all("the engine loop was cancelled", abort=True)
                raise
            except Exception as err:  # a defect inside the engine: end what was in flight, keep serving
                logger.exception("an engine step failed; its requests end with an error")
                if not self._end_all(f"{type(err).__name__}: {err}", abort=False):
                    return
                continue
            for update in updates:
                stream = self._streams.get(update.request_id)
                if stream is not None and update.delta:
                    stream.put_nowait(update.delta)
                if update.finished:
                    self._deliver(update.request_id)

    def _end_all(self, reason: str, abort: bool) -> bool:
        """End every unfinished request (abort, or fail with `reason`) and deliver it. False if the
        engine could not let go of them (its state is broken: the loop stops rather than spin)."""
        for request_id in self.engine.unfinished_ids():
            try:
                if abort:
                    self.engine.abort(request_id)
                else:
                    self.engine.fail(request_id, reason)
                self._deliver(request_id)
            except Exception:
                logger.exception("could not end request %r", request_id)
        return not self.engine.has_unfinished()
