"""The engine core process: a busy loop around `LLMEngine` that never waits for its front end.

    while the front end is there:
        take every message waiting (add, abort, stop a sample) — wait for one only when idle
        step the engine (schedule, forward, sample), send what it gave: one CoreStep

The core decodes no text: its engine judges the stops that need none (EOS, stop token ids, lengths)
and the front end, which has the text, tells it when a stop string ended a sample. The core's main
thread is the only one doing torch work in its process, so its OpenMP threads have the cores to
themselves.

It ends when told (`Shutdown`), and on its own when its front end is gone: the pipe's other end
closed (the front end exited or was killed) or its parent process changed — never an orphan.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from multiprocessing.connection import Connection

import torch

from minillm.disagg.kv_connector import KVConnector
from minillm.engine import EngineStopped, LLMEngine
from minillm.engine_core.messages import (
    AbortRequest,
    AddRequest,
    CoreFailed,
    CoreReady,
    CoreStep,
    DiscardKV,
    Refused,
    RequestDone,
    SampleTokens,
    Shutdown,
    StartCore,
    StopSample,
)
from minillm.model.loader import load
from minillm.timeline import Timeline, instrument, span

IDLE_POLL_S = 0.5  # how often an idle core checks that its front end is still there


def main(inbox_fd: int, outbox_fd: int) -> None:
    """The core process's main (`python -m minillm.engine_core.core INBOX_FD OUTBOX_FD`): read what to
    serve from the front end, load the model, say `CoreReady` (or `CoreFailed` and why), then loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the front end's: it shuts the core down
    inbox, outbox = Connection(inbox_fd, writable=False), Connection(outbox_fd, readable=False)
    try:
        start: StartCore = inbox.recv()
    except (EOFError, OSError):
        return
    if start.threads is not None:
        torch.set_num_threads(start.threads)
    try:
        net, tokenizer = load(start.model, dtype=start.config.dtype, device=start.config.device)
        engine = LLMEngine(net, tokenizer, start.config, detokenize=False)
    except Exception as err:
        try:
            outbox.send(CoreFailed(err))
        except Exception:  # an exception that does not pickle: its words then
            outbox.send(CoreFailed(RuntimeError(f"{type(err).__name__}: {err}")))
        return
    try:  # a disaggregated pair (chapter 13): meet the other core
        connector = KVConnector(start.kv_transfer, engine) if start.kv_transfer is not None else None
    except Exception as err:
        engine.close()
        outbox.send(CoreFailed(RuntimeError(f"{type(err).__name__}: {err}")))
        return
    timeline = Timeline("core") if start.timeline else None
    if timeline is not None:
        instrument(engine, timeline)
    outbox.send(CoreReady(engine.max_model_len, net.config))
    with contextlib.suppress(EOFError, OSError):  # the front end went away while we sent
        try:
            EngineCore(engine, inbox, outbox, start.parent_pid, timeline, connector).run()
        except EngineStopped as err:  # a tensor-parallel worker was lost: the front end hears why
            outbox.send(CoreFailed(err))
    engine.close()


class EngineCore:
    def __init__(self, engine: LLMEngine, inbox: Connection, outbox: Connection, parent_pid: int,
                 timeline: Timeline | None = None, connector: KVConnector | None = None):
        self.engine, self.inbox, self.outbox, self.parent_pid = engine, inbox, outbox, parent_pid
        self.timeline = timeline  # when recording: its spans go to the front end with each step
        self.connector = connector  # a disaggregated pair's prefill or decode core (chapter 13)
        self.exporting: set[str] = set()  # a prefill core: requests whose K/V go to the decode core when done
        self.live: set[str] = set()  # requests added and not yet reported done
        self.news = CoreStep(0.0)  # what the messages themselves produced (refusals), sent with the next step
        self.changed = False  # a message changed the engine's state since the last CoreStep was sent

    def run(self) -> None:
        while self._take_messages(wait=not self.engine.has_unfinished()):
            compiling = self.engine.waiting_for_grammars()  # all that is left waits for grammars to compile
            if self.engine.has_unfinished() and not compiling:
                with span(self.timeline, "update"):  # the engine's step nests in it: what is left is bookkeeping
                    step = self._step()
                self._send(step)
            elif self.changed:  # nothing to step, but a message changed something (a refusal, freed blocks)
                self.news.gauges = self.engine.gauges()
                self._send(self.news)
            self.changed = False
            if compiling:  # no empty steps sent meanwhile: wait for one, checking messages between waits
                self.engine.structured.wait(compiling)

    def _front_end_alive(self) -> bool:
        return os.getppid() == self.parent_pid

    def _take_messages(self, wait: bool) -> bool:
        """Apply every message waiting (waiting for one first when `wait`). False when the core should end."""
        try:
            if wait:
                while not self.inbox.poll(IDLE_POLL_S):
                    if not self._front_end_alive():
                        return False
            elif not self._front_end_alive():
                return False
            while self.inbox.poll(0):
                if not self._apply(self.inbox.recv()):
                    return False
        except (EOFError, OSError):  # the front end's end of the pipe is closed: it is gone
            return False
        return True

    def _apply(self, message) -> bool:
        engine = self.engine
        self.changed = True
        if isinstance(message, AddRequest):
            if message.kv is not None and self.connector is not None:  # its prompt's K/V, computed elsewhere
                self.connector.receive(message.kv)
            try:
                engine.add_request(message.prompt_token_ids, message.params, request_id=message.request_id,
                                   arrival_time=message.arrival_time)
                self.live.add(message.request_id)
                if message.export_kv and self.connector is not None:
                    self.exporting.add(message.request_id)
            except Exception as err:  # refused at the door: this request's error alone
                self.news.refused.append(Refused(message.request_id, str(err)))
        elif isinstance(message, DiscardKV):
            if self.connector is not None:
                self.connector.discard(message.kv)
        elif isinstance(message, AbortRequest):  # the front end has already answered its caller
            if engine.abort(message.request_id) or message.request_id in self.live:
                self._forget(message.request_id)
        elif isinstance(message, StopSample):
            engine.finish_sample(message.sample_id, "stop")
        elif isinstance(message, Shutdown):
            return False
        return True

    def _forget(self, request_id: str) -> None:
        self.live.discard(request_id)
        self.exporting.discard(request_id)
        if request_id in self.engine.requests:
            self.engine.release(request_id)

    def _step(self) -> CoreStep:
        engine = self.engine
        began = time.perf_counter()
        updates = engine.step()
        step, self.news = self.news, CoreStep(0.0)
        step.time = time.perf_counter()
        if self.connector is not None:  # the step's span, for a replay of the pair (chapter 13)
            tokens = engine.trace.steps[-1].num_tokens if engine.trace.steps else 0
            self.connector.spans.append((self.connector.role, began, step.time, f"{tokens} tokens computed"))
        for update in updates:
            if not (update.token_ids or update.sample_finished):
                continue
            sample = engine.requests[update.request_id].samples[update.index]
            first = update.index == 0 and sample.num_output_tokens == len(update.token_ids)
            step.samples.append(SampleTokens(
                update.request_id, update.index, update.token_ids, update.logprobs,
                sample.finish_reason if update.sample_finished else None,
                sample.num_cached_tokens if first else None,
                tuple(sample.prompt_logprobs) if first and sample.params.prompt_logprobs is not None else None))
        for request_id in [r for r in self.live if engine.is_done(r)]:
            request = engine.requests[request_id]
            if request_id in self.exporting:  # its prefill is done: its K/V go to the decode core now
                self.exporting.discard(request_id)
                if request.finish_reason in ("stop", "length"):
                    step.kv_sent.append(self.connector.send(request_id, request.prompt_token_ids))
            step.done.append(RequestDone(request_id, tuple(s.finish_reason for s in request.samples), request.error))
            self._forget(request_id)
        if self.connector is not None:
            self.connector.reap()
            step.lane_spans = self.connector.drain_spans()
        step.gauges = engine.gauges()
        if self.timeline is not None:
            step.spans = self.timeline.drain()  # this step's (its own bookkeeping and sending: with the next)
        return step

    def _send(self, step: CoreStep) -> None:
        with span(self.timeline, "send"):
            self.outbox.send(step)
        if step is self.news:
            self.news = CoreStep(0.0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
