"""DisaggregatedLLM: `AsyncLLM`'s API over two engine cores, one that prefills and one that decodes.

    submit(prompt) ─► router ─► prefill core: AddRequest(max_new_tokens=1, export_kv)
                                   │ computes the prompt, sends its blocks' K/V (kv_connector.py)
                                   ▼ CoreStep.kv_sent: the handle
                      router ─► decode core: AddRequest(the request as asked, kv=handle)
                                   │ receives the K/V as cached blocks, computes the last prompt
                                   ▼ tokens, decodes: every output token comes from here
                      router ◄── CoreSteps: text, streams, futures (ProcessAsyncLLM's front end)

A prompt never runs on the decode core's steps (beyond its last partial block), so a long prompt
arriving does not stall the decoding requests there — the interference chunked prefill only
spreads thin. The price: the transfer (TTFT grows by it), and two engines' memory.

The router is a ProcessAsyncLLM whose core is the decode core, plus a prefill core it feeds first.
An abort goes to both. A transfer for a request aborted meanwhile is still taken by the decode core
and dropped (`DiscardKV`), so the prefill core's buffer is freed; blocks already adopted wait as
evictable cache. If either core dies, every request in flight ends with the error.
"""

from __future__ import annotations

import asyncio
import datetime
import os

import torch.distributed as dist

from minillm.config import EngineConfig
from minillm.disagg.kv_connector import KVHandle, KVTransfer
from minillm.engine_core.client import ProcessAsyncLLM
from minillm.engine_core.messages import AbortRequest, AddRequest, CoreFailed, CoreStep, DiscardKV, StartCore
from minillm.engine_core.output_processor import RequestState
from minillm.engine_core.process import CoreProcess
from minillm.sampling import SamplingParams

PREFILL_PARAMS = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)  # its one token is not used


class DisaggregatedLLM(ProcessAsyncLLM):
    """`config`: the decode engine's; `prefill_config`: the prefill engine's (default: the same). Both need
    kv="paged" and prefix_cache=True. `threads`: (prefill core, decode core) torch threads."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 prefill_config: EngineConfig | None = None, threads: tuple[int | None, int | None] = (None, None)):
        config = config if config is not None else EngineConfig(kv="paged", prefix_cache=True)
        prefill_config = prefill_config if prefill_config is not None else config
        for name, c in (("config", config), ("prefill_config", prefill_config)):
            if not isinstance(c, EngineConfig) or c.kv != "paged" or not c.prefix_cache:
                raise ValueError(f"{name} must be an EngineConfig with kv='paged' and prefix_cache=True: the K/V "
                                 "arrive as cached blocks")
        self._store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=60),
                                    wait_for_workers=False)  # where the two cores meet
        self._prefill = CoreProcess(StartCore(model, prefill_config, os.getpid(), threads[0], False,
                                              KVTransfer("prefill", self._store.port)), name="prefill core")
        try:
            super().__init__(model, config, threads[1], kv_transfer=KVTransfer("decode", self._store.port))
            self._prefill.wait_until_ready()
        except BaseException:
            self._prefill.stop()
            raise
        self.transfers: list[tuple[KVHandle, float]] = []  # (handle, when the router forwarded it), for a replay
        self.lane_spans: list[tuple[str, str, float, float, str]] = []  # (lane, kind, start, end, label)
        self.prefill_gauges: dict[str, float] = {}  # the prefill engine's state after its latest step

    @property
    def prefill_pid(self) -> int:
        return self._prefill.process.pid

    # ------------------------------------------------------------------ the router's decisions
    def _receive(self, sub) -> None:
        """A new request goes to the prefill core first; the decode core gets it with its K/V."""
        if sub.future.done():
            self._end_stream(sub.stream)
            return
        try:
            state = self._state(sub)
        except Exception as err:  # refused at the door
            sub.future.set_exception(err)
            self._end_stream(sub.stream)
            return
        self._live[state.core_id], self._core_id_of[state.request_id] = state, state.core_id
        if self._error is None:
            self._prefill.send(AddRequest(state.core_id, state.prompt_token_ids, PREFILL_PARAMS,
                                          state.metrics.arrival_time, export_kv=True))

    def _abort_now(self, request_id: str) -> bool:
        core_id = self._core_id_of.get(request_id)
        if core_id is not None and self._error is None:
            self._prefill.send(AbortRequest(core_id))
        return super()._abort_now(request_id)

    def _on_prefill_output(self) -> None:
        try:
            while self._prefill.from_core.poll():
                self._apply_prefill(self._prefill.from_core.recv())
        except (EOFError, OSError):
            self._core_gone(f"the prefill core process ended (exit code {self._prefill.exit_code()})")

    def _apply_prefill(self, step: CoreStep | CoreFailed) -> None:
        if isinstance(step, CoreFailed):
            self._core_gone(f"the prefill core stopped: {step.error}")
            return
        if step.gauges:
            self.prefill_gauges = step.gauges
        for kind, start, end, label in step.lane_spans:
            self.lane_spans.append(("prefill worker", kind, start, end, label))
        for refused in step.refused:  # the prefill engine refused it (too long for its cache...)
            self._fail(refused.request_id, ValueError(refused.error))
        for handle in step.kv_sent:
            state = self._live.get(handle.request_id)
            if state is None:  # aborted meanwhile: its bytes are taken and dropped
                self._send(DiscardKV(handle))
                continue
            self.transfers.append((handle, step.time))
            self._send(AddRequest(state.core_id, state.prompt_token_ids, state.params, state.metrics.arrival_time,
                                  kv=handle))
        for done in step.done:  # ended without its K/V sent: failed, or aborted there
            state = self._live.get(done.request_id)
            if state is not None and done.finish_reasons[0] in ("error", "abort") and done.error is not None:
                self._fail(done.request_id, RuntimeError(f"its prefill failed: {done.error}"))

    def _fail(self, core_id: str, error: Exception) -> None:
        state: RequestState | None = self._live.get(core_id)
        if state is None:
            return
        self._forget(state)
        if not state.future.done():
            state.future.set_exception(error)
        self._end_stream(state.stream)

    def _apply(self, step: CoreStep | CoreFailed) -> None:
        for kind, start, end, label in getattr(step, "lane_spans", ()):
            self.lane_spans.append(("decode worker", kind, start, end, label))
        super()._apply(step)

    # ------------------------------------------------------------------ AsyncLLM's hooks
    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        old = self._reader_loop
        loop = super()._bind_loop()
        if loop is not old:
            if old is not None and not old.is_closed():
                old.remove_reader(self._prefill.from_core.fileno())
            if self._error is None:
                loop.add_reader(self._prefill.from_core.fileno(), self._on_prefill_output)
        return loop

    def _reclaim(self) -> None:
        for core_id in list(self._live):
            self._prefill.send(AbortRequest(core_id))
        super()._reclaim()

    def _core_gone(self, why: str, log: bool = True) -> None:
        if self._error is None and self._reader_loop is not None and not self._reader_loop.is_closed():
            self._reader_loop.remove_reader(self._prefill.from_core.fileno())
        super()._core_gone(why, log)

    def close(self) -> None:
        super().close()
        self._prefill.stop()
