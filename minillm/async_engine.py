"""AsyncLLM: submit requests at any time and get an awaitable future back at once.

    fut = llm.submit("ROMEO:", params)          # returns immediately
    ...                                          # submit more, from anywhere in the event loop
    out = await fut                              # resolved when the request finishes

    async for delta in llm.stream("JULIET:", params):   # text as it is generated
        print(delta, end="")

One background task runs the engine loop while there is work: a step, then the event loop's other
work (Jupyter's included: I/O, submissions, aborts), then the next step. Submissions and aborts are
queued and applied between steps, so the engine itself is only ever touched by one step at a time.
The step runs on the event loop's own thread, not a worker thread: on CPU, torch's operators in a
second thread get an OpenMP thread team of their own, and with two teams on the cores libgomp makes
every worker sleep between operators instead of spinning (a step loop measured 1.5x slower in a
worker thread on two cores, with 50,000 context switches where the loop's thread has 50). A server
that must answer during steps runs the engine core in its own process (minillm/engine_core/).

A text prompt is tokenized in a worker thread before it is queued (`encode`), never on the event
loop nor under the engine's lock: one long prompt holds up no other stream. A text too long for the
context whatever its tokens is refused before it is tokenized at all. (So a text prompt joins the
queue after the ids submitted while it was being tokenized.)

Cancellation is abort: cancelling a future (or a timeout around it, `asyncio.wait_for`), or leaving
a stream early, aborts the request, and its KV is free before the next step. The loop never dies
of one request: a refused request's future raises its ValueError, a failed one resolves with
finish_reason "error", and later submissions are served.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from minillm.config import EngineConfig
from minillm.engine import LLMEngine, RequestOutput, StepUpdate
from minillm.logprobs import TokenLogprob
from minillm.model.loader import load
from minillm.prompts import check_text_length, encode_prompt, longest_token_chars
from minillm.sampling import SamplingParams
from minillm.structured.manager import GRAMMAR_WAIT_S
from minillm.timeline import Timeline, instrument, span

logger = logging.getLogger("minillm")


@dataclass(frozen=True)
class StreamEvent:
    """One piece of a streamed request (`AsyncLLM.stream_events`): what a step gave one sample — its
    new text, tokens and their logprobs, whether it is done — or, last, the request's whole output."""

    index: int = 0  # which sample (n > 1)
    delta: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # when the request asked for logprobs
    finish_reason: str | None = None  # this sample's, once it is done
    generated: int = 0  # tokens every sample has generated so far (a usage so far)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # with the first tokens, when asked for
    output: RequestOutput | None = None  # the last event only: the whole output, whatever the ending


@dataclass
class _Submission:
    request_id: str
    prompt: str | Sequence[int]
    params: SamplingParams | None
    future: asyncio.Future
    stream: asyncio.Queue | None  # StreamEvents, then None at the end
    text: str | None = None  # a text prompt, kept for the output once `prompt` holds its token ids
    aborted: bool = False  # aborted while its text was being tokenized
    resolver: asyncio.Task | None = None  # the task tokenizing its text


class AsyncLLM:
    """Serves one event loop at a time; the engine behind it is touched under `engine.lock` only."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 engine: LLMEngine | None = None, timeline: Timeline | None = None):
        """`timeline`: record what the engine and its callers did, span by span (chapter 10); off by default."""
        if engine is None:
            config = config if config is not None else EngineConfig()
            net, tokenizer = load(model, dtype=config.dtype, device=config.device)
            engine = LLMEngine(net, tokenizer, config)
        self.engine = engine
        self.timeline = timeline
        if timeline is not None:
            instrument(engine, timeline)
        self._front_end(engine.tokenizer, engine.model.config, engine.config, engine.max_model_len)

    def _front_end(self, tokenizer, model_config, config: EngineConfig, max_model_len: int) -> None:
        """What the caller's side needs to check and tokenize requests, and its queues."""
        self.tokenizer, self.model_config, self.config, self.max_model_len = tokenizer, model_config, config, \
            max_model_len
        self._pending: list[_Submission] = []
        self._aborts: list[str] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._resolving: list[_Submission] = []  # text prompts being tokenized, not yet queued
        self._ids = itertools.count()
        self._loop_task: asyncio.Task | None = None
        self._epoch = 0  # bumped when the work of an abandoned event loop is reclaimed
        self._chars_per_token: int | None = None  # the most characters one token decodes to (found once)

    async def encode(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> list[int]:
        """The prompt's checked token ids, worked out in a worker thread (the event loop keeps serving).
        A text too long to fit the context whatever its tokens is refused before it is tokenized; a
        list of ids longer than the context before its ids are looked at. Raises ValueError (prompts.py)."""
        loop, vocab_size = asyncio.get_running_loop(), self.model_config.vocab_size
        if isinstance(prompt, str):
            if self._chars_per_token is None:
                self._chars_per_token = await loop.run_in_executor(None, longest_token_chars, self.tokenizer,
                                                                   vocab_size)
            check_text_length(prompt, self.max_model_len, self._chars_per_token)
        work = encode_prompt if self.timeline is None else functools.partial(self.timeline.call, "tokenize",
                                                                            encode_prompt)
        return await loop.run_in_executor(None, work, self.tokenizer, prompt, self.max_model_len, vocab_size,
                                          add_special_tokens)

    def gauges(self) -> dict[str, float]:
        """The engine's state now (running, waiting, KV blocks...): `LLMEngine.gauges`."""
        return self.engine.gauges()

    @property
    def error(self) -> str | None:
        """Why this AsyncLLM can serve no more requests (its engine has stopped), or None."""
        return self.engine.dead

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
        RuntimeError with the error, after the text it produced. One text: for n > 1 samples (or their
        logprobs) use `stream_events`."""
        if params is not None and getattr(params, "n", 1) > 1:
            raise ValueError(f"stream() yields one text, and n={params.n} samples were asked for: use stream_events, "
                             "whose events say which sample each piece belongs to")
        queue: asyncio.Queue = asyncio.Queue()
        future = self._enqueue(prompt, params, request_id, stream=queue)
        try:
            while (item := await queue.get()) is not None:
                if item.delta:
                    yield item.delta
        finally:
            if not future.done():  # the consumer left before the end
                future.cancel()
        output: RequestOutput = future.result()  # raises the ValueError of a refused request
        if output.finish_reason == "error":
            raise RuntimeError(f"request {output.request_id!r} failed: {output.error}")

    async def stream_events(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                            request_id: str | None = None) -> AsyncIterator[StreamEvent]:
        """Like `stream`, for a server: a StreamEvent per step and sample that produced something (text,
        tokens, or its end), then one last event carrying the RequestOutput whatever the ending (stop,
        length, abort, error). Leaving early aborts the request; a refused request raises its ValueError."""
        queue: asyncio.Queue = asyncio.Queue()
        future = self._enqueue(prompt, params, request_id, stream=queue)
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            if not future.done():  # the consumer left before the end
                future.cancel()
        output: RequestOutput = future.result()
        yield StreamEvent(generated=sum(len(o.token_ids) for o in output.outputs), output=output)

    def abort(self, request_id: str) -> None:
        """Abort a submitted request; its future resolves with finish_reason "abort". Unknown or
        finished ids are ignored."""
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str, got {type(request_id).__name__}")
        self._bind_loop()
        for sub in self._resolving:  # still being tokenized: aborted as soon as it is queued
            sub.aborted = sub.aborted or sub.request_id == request_id
        self._aborts.append(request_id)
        self._ensure_running()

    # ------------------------------------------------------------------ the caller's side (event-loop thread)
    def _enqueue(self, prompt, params, request_id, stream) -> asyncio.Future:
        loop = self._bind_loop()
        future = loop.create_future()
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            future.set_exception(ValueError(f"request_id must be a non-empty str or None, got {request_id!r}"))
            self._end_stream(stream)
            return future
        if request_id is not None and any(sub.request_id == request_id for sub in (*self._pending, *self._resolving)):
            # an earlier submission still being tokenized holds the id: refused now, whichever tokenizes first
            future.set_exception(ValueError(f"request_id {request_id!r} is already in use"))
            self._end_stream(stream)
            return future
        n = params.n if isinstance(params, SamplingParams) else 1
        request_id = request_id if request_id is not None else self._new_request_id(n)
        sub = _Submission(request_id, prompt, params, future, stream)
        future.add_done_callback(lambda f: self._on_done(request_id, f))
        if isinstance(prompt, str):  # tokenized in a worker thread first, then queued
            sub.text = prompt
            self._resolving.append(sub)
            sub.resolver = loop.create_task(self._resolve(sub, self._epoch))
            return future
        self._pending.append(sub)
        self._ensure_running()
        return future

    async def _resolve(self, sub: _Submission, epoch: int) -> None:
        """Tokenize a submission's text off the event loop, then queue it (or refuse it)."""
        error: BaseException | None = None
        try:
            ids = await self.encode(sub.prompt)
        except Exception as err:  # refused (ValueError), or the executor is gone: this request's error alone
            error = err
        if epoch != self._epoch:  # its event loop was abandoned and its work reclaimed meanwhile
            return
        self._resolving.remove(sub)
        if sub.future.done():  # cancelled while it was being tokenized
            self._end_stream(sub.stream)
            return
        if error is not None:
            sub.future.set_exception(error)
            self._end_stream(sub.stream)
            return
        sub.prompt = ids
        self._pending.append(sub)
        if sub.aborted:
            self._aborts.append(sub.request_id)  # applied right after it is admitted, as for any queued request
        self._ensure_running()

    def _new_request_id(self, n: int) -> str:
        taken = {sub.request_id for sub in (*self._pending, *self._resolving)}
        while not self.engine.ids_free(request_id := f"async-{next(self._ids)}", n) or request_id in taken or any(
                f"{request_id}#{i}" in taken for i in range(1, n)):
            pass
        return request_id

    def _on_done(self, request_id: str, future: asyncio.Future) -> None:
        """A cancelled future aborts its own request (not another one that shares its id)."""
        request = self.engine.requests.get(request_id)
        if future.cancelled() and request is not None and request.future is future:
            self.abort(request_id)

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, which this AsyncLLM now serves. Work left by a loop that stopped or
        closed is reclaimed (aborted); a loop still running in another thread is refused."""
        loop = running_loop()
        task = self._loop_task
        if task is not None and not task.done() and task.get_loop() is not loop:
            if task.get_loop().is_running():
                raise RuntimeError("this AsyncLLM is serving an event loop in another thread: create one AsyncLLM "
                                   "per event loop")
            self._reclaim()
        return loop

    def _reclaim(self) -> None:
        """Abort everything an abandoned event loop left in flight; its task, if it ever runs again,
        sees a new epoch and stops."""
        self._epoch += 1
        self._loop_task = None
        with self.engine.lock:
            for request_id in self.engine.unfinished_ids():
                self.engine.abort(request_id)
                self.engine.release(request_id)
        self._pending, self._aborts, self._streams, self._resolving = [], [], {}, []

    def _ensure_running(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run(self._epoch))

    # ------------------------------------------------------------------ the engine's side
    def _apply_queued(self) -> None:
        """Between steps (holding the engine's lock): apply aborts, admit new submissions, then the
        aborts of requests just admitted. Aborting first frees the id of a request that timed out
        for its retry."""
        aborts, self._aborts = self._aborts, []
        later = [request_id for request_id in aborts if not self._abort_now(request_id)]
        pending, self._pending = self._pending, []
        for sub in pending:
            if sub.future.done():  # cancelled before it was admitted
                self._end_stream(sub.stream)
                continue
            try:
                request = self.engine.add_request(sub.prompt, sub.params, request_id=sub.request_id)
            except Exception as err:  # refused at the door, whatever the type: this request's error alone
                sub.future.set_exception(err)
                self._end_stream(sub.stream)
                continue
            request.future = sub.future  # the request owns its future (its input field group)
            if sub.text is not None:
                request.prompt = sub.text  # queued as its token ids; its output still shows the text
            if sub.stream is not None:
                self._streams[sub.request_id] = sub.stream
        for request_id in later:
            self._abort_now(request_id)

    def _abort_now(self, request_id: str) -> bool:
        if not self.engine.abort(request_id):
            return False
        self._deliver(request_id)
        return True

    def _deliver(self, request_id: str) -> None:
        request = self.engine.requests[request_id]
        output: RequestOutput = self.engine.output(request_id)
        self.engine.release(request_id)
        if request.future is not None and not request.future.done():
            request.future.set_result(output)
        self._end_stream(self._streams.pop(request_id, None))

    @staticmethod
    def _end_stream(stream: asyncio.Queue | None) -> None:
        if stream is not None:
            stream.put_nowait(None)

    async def _run(self, epoch: int) -> None:
        lock = self.engine.lock
        waits: dict = {}  # a compiling grammar's future -> the asyncio future awaiting it: one each, however
        #                   many rounds it takes (each wrap adds a callback to the grammar's future)
        while epoch == self._epoch:
            try:
                with lock:
                    with span(self.timeline if self._pending or self._aborts else None, "receive"):
                        self._apply_queued()
                    if not self.engine.has_unfinished():
                        return
                    compiling = self.engine.waiting_for_grammars()  # nothing to step until one is compiled
                    updates = self.engine.step() if not compiling else []  # on the event loop's thread: see
                    #                                                        the module's docstring
                    for update in updates:
                        stream = self._streams.get(update.request_id)
                        if stream is not None and (update.delta or update.token_ids or update.sample_finished):
                            stream.put_nowait(self._event(update))
                        if update.finished:
                            self._deliver(update.request_id)
                try:
                    if compiling:  # the loop runs meanwhile; a submission or an abort wakes nobody, but is
                        #            taken within GRAMMAR_WAIT_S
                        waits = {f: waits.get(f) or asyncio.wrap_future(f) for f in compiling}
                        await asyncio.wait(list(waits.values()), timeout=GRAMMAR_WAIT_S,
                                           return_when=asyncio.FIRST_COMPLETED)
                    await _let_the_loop_run()  # its other work between steps: I/O, submissions, aborts
                except asyncio.CancelledError:  # the event loop is shutting down: nobody will await these
                    with lock:
                        self._end_all("the engine loop was cancelled", abort=True)
                        self._pending, self._aborts = [], []
                    raise
                if epoch != self._epoch:  # reclaimed meanwhile
                    return
            except Exception as err:  # a defect inside the engine: end what was in flight, keep serving
                logger.exception("an engine step failed; its requests end with an error")
                with lock:
                    if not self._end_all(f"{type(err).__name__}: {err}", abort=False):
                        return

    def _event(self, update: StepUpdate) -> StreamEvent:
        samples = self.engine.requests[update.request_id].samples
        sample = samples[update.index]
        first = update.index == 0 and update.token_ids and sample.num_output_tokens == len(update.token_ids)
        prompt_logprobs = tuple(sample.prompt_logprobs) if first and sample.params.prompt_logprobs is not None \
            else None  # complete once the first token is out
        return StreamEvent(update.index, update.delta, update.token_ids, update.logprobs,
                           sample.finish_reason if update.sample_finished else None,
                           sum(s.num_output_tokens for s in samples), prompt_logprobs)

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


def running_loop() -> asyncio.AbstractEventLoop:
    """The running event loop, or a RuntimeError that says how to call AsyncLLM instead."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError("AsyncLLM needs a running event loop (await it from async code, or use LLM for "
                           "plain synchronous calls)") from None


MAX_YIELDS = 100  # at most this many rounds of the event loop's other work between two steps


async def _let_the_loop_run() -> None:
    """Yield to the event loop until its queue of ready callbacks is empty (or MAX_YIELDS rounds):
    a step blocks the loop, and work such as a request's way through the HTTP server or a
    cancellation takes several rounds, each of which would otherwise wait for a step of its own."""
    await asyncio.sleep(0)
    ready = getattr(asyncio.get_running_loop(), "_ready", None)  # asyncio's own loop; others: one round
    for _ in range(MAX_YIELDS - 1):
        if not ready:
            return
        await asyncio.sleep(0)

