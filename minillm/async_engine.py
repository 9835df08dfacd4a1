"""AsyncLLM: submit requests at any time and get an awaitable future back at once.

    fut = llm.submit("ROMEO:", params)          # returns immediately
    ...                                          # submit more, from anywhere in the event loop
    out = await fut                              # resolved when the request finishes

    async for delta in llm.stream("JULIET:", params):   # text as it is generated
        print(delta, end="")

One background task runs the engine loop while there is work. Each step runs in a worker thread,
so the event loop (Jupyter's included) stays responsive; submissions and aborts are queued and
applied between steps, so the engine itself is only ever touched by one step at a time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

from minillm.config import EngineConfig
from minillm.engine import LLMEngine, RequestOutput
from minillm.model.loader import load
from minillm.sampling import SamplingParams


class AsyncLLM:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 engine: LLMEngine | None = None):
        if engine is None:
            config = config or EngineConfig()
            net, tokenizer = load(model, dtype=config.dtype, device=config.device)
            engine = LLMEngine(net, tokenizer, config)
        self.engine = engine
        self._pending: list[tuple[str, str | Sequence[int], SamplingParams, asyncio.Future, asyncio.Queue | None]] = []
        self._aborts: list[str] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._ids = itertools.count()
        self._loop_task: asyncio.Task | None = None

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None) -> asyncio.Future:
        """Queue a request; the returned future resolves to its RequestOutput (or raises the
        ValueError that rejected it). Must be called from a running event loop."""
        return self._enqueue(prompt, params, request_id, stream=None)

    async def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                     request_id: str | None = None) -> AsyncIterator[str]:
        """Yield the request's text deltas as the engine produces them."""
        queue: asyncio.Queue = asyncio.Queue()
        future = self._enqueue(prompt, params, request_id, stream=queue)
        while True:
            delta = await queue.get()
            if delta is None:
                break
            yield delta
        future.result()  # re-raise a rejection

    def abort(self, request_id: str) -> None:
        """Abort a submitted request; its future resolves with finish_reason "abort"."""
        self._aborts.append(request_id)
        self._ensure_running()

    def _enqueue(self, prompt, params, request_id, stream) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        request_id = request_id if request_id is not None else f"async-{next(self._ids)}"
        self._pending.append((request_id, prompt, params or SamplingParams(), future, stream))
        self._ensure_running()
        return future

    def _ensure_running(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def _apply_queued(self) -> None:
        """Between steps: admit new submissions, apply aborts (the engine is idle now)."""
        pending, self._pending = self._pending, []
        for request_id, prompt, params, future, stream in pending:
            try:
                request = self.engine.add_request(prompt, params, request_id=request_id)
            except ValueError as err:
                future.set_exception(err)
                if stream is not None:
                    stream.put_nowait(None)
                continue
            request.future = future  # the request owns its future (its input field group)
            if stream is not None:
                self._streams[request_id] = stream
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            if self.engine.abort(request_id):
                self._deliver(request_id)

    def _deliver(self, request_id: str) -> None:
        future = self.engine.requests[request_id].future
        output: RequestOutput = self.engine.output(request_id)
        self.engine.release(request_id)
        if not future.done():
            future.set_result(output)
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put_nowait(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._apply_queued()
            if not self.engine.has_unfinished():
                return
            updates = await loop.run_in_executor(None, self.engine.step)
            for update in updates:
                stream = self._streams.get(update.request_id)
                if stream is not None and update.delta:
                    stream.put_nowait(update.delta)
                if update.finished:
                    self._deliver(update.request_id)
