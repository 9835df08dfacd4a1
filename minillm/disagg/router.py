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
from collections import deque

import torch.distributed as dist

from minillm.config import EngineConfig
from minillm.disagg.kv_connector import KVHandle, KVTransfer
from minillm.engine_core.client import ProcessAsyncLLM
from minillm.engine_core.messages import (
    AbortRequest,
    AddRequest,
    CoreFailed,
    CoreReady,
    CoreStep,
    DiscardKV,
    StartCore,
)
from minillm.engine_core.output_processor import RequestState
from minillm.engine_core.process import START_POLL_S, CoreProcess
from minillm.sampling import SamplingParams

PREFILL_PARAMS = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)  # its one token is not used
REPLAY_LIMIT = 20_000  # the newest transfers and lane spans kept (as a rank keeps its collectives)


class DisaggregatedLLM(ProcessAsyncLLM):
    """`config`: the decode engine's; `prefill_config`: the prefill engine's (default: the same). Both need
    kv="paged" and prefix_cache=True, one rank and K/V in the model's dtype; they may differ in what each engine
    holds and schedules (max_num_seqs, kv_cache_bytes, max_model_len, chunked prefill...), not in what the K/V are
    (block_size, dtype, quantization). A prompt the prefill engine refuses (longer than its context, say) is
    computed by the decode engine itself. `threads`: (prefill core, decode core) torch threads."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 prefill_config: EngineConfig | None = None, threads: tuple[int | None, int | None] = (None, None)):
        config = config if config is not None else EngineConfig(kv="paged", prefix_cache=True)
        prefill_config = prefill_config if prefill_config is not None else config
        _check_pair(config, prefill_config)  # before either core loads a model
        self._store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=60),
                                    wait_for_workers=False)  # where the two cores meet
        self._prefill = CoreProcess(StartCore(model, prefill_config, os.getpid(), threads[0], False,
                                              KVTransfer("prefill", self._store.port)), name="prefill core")
        try:  # waits for both cores (_wait_until_ready)
            super().__init__(model, config, threads[1], kv_transfer=KVTransfer("decode", self._store.port))
        except BaseException:
            self._prefill.stop()
            raise
        # for a replay, the newest REPLAY_LIMIT of each (a server steps for days: every step adds a span)
        self.transfers: deque[tuple[KVHandle, float]] = deque(maxlen=REPLAY_LIMIT)  # (handle, when forwarded)
        self.lane_spans: deque[tuple[str, str, float, float, str]] = deque(maxlen=REPLAY_LIMIT)  # (lane, kind,
        #                                                                                  start, end, label)
        self.prefill_gauges: dict[str, float] = {}  # the prefill engine's state after its latest step

    @property
    def prefill_pid(self) -> int:
        return self._prefill.process.pid

    # ------------------------------------------------------------------ the router's decisions
    def _hand_on(self, state: RequestState) -> None:
        """A new request goes to the prefill core first; the decode core gets it with its K/V."""
        if self._error is not None:
            return
        if state.params.prompt_logprobs is not None:  # the decode engine computes every prompt token of such a
            self._to_decode(state)  #                    request (no prefix hit can give their logprobs): no prefill
        else:
            self._prefill.send(AddRequest(state.core_id, state.prompt_token_ids, PREFILL_PARAMS,
                                          state.metrics.arrival_time, export_kv=True))

    def _to_decode(self, state: RequestState, kv: KVHandle | None = None) -> None:
        """The request as asked, to the decode core: with its prompt's K/V, or (None) to compute its prompt there."""
        self._send(AddRequest(state.core_id, state.prompt_token_ids, state.params, state.metrics.arrival_time, kv=kv))

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
        for refused in step.refused:  # the prefill engine cannot take it (a shorter context, a smaller cache...):
            state = self._live.get(refused.request_id)  # the decode engine computes its prompt, or refuses it
            if state is not None:
                self._to_decode(state)
        for handle in step.kv_sent:
            state = self._live.get(handle.request_id)
            if state is None:  # aborted meanwhile: its bytes are taken and dropped
                self._send(DiscardKV(handle))
                continue
            self.transfers.append((handle, step.time))
            self._to_decode(state, handle)
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
    def _wait_until_ready(self) -> CoreReady:
        """Both cores' CoreReady (the decode core's returned). Each meets the other once its engine is built, so a
        core that cannot start leaves the other waiting for it: its own error is raised at once — not, a minute
        later, the other's timeout at their meeting point — and the waiting core, which holds nothing yet, is
        killed."""
        cores = {"prefill": self._prefill, "decode": self._core}
        ready: dict[str, CoreReady] = {}
        while len(ready) < len(cores):
            for role, core in cores.items():
                if role in ready:
                    continue
                try:
                    message = core.poll_ready(START_POLL_S / 2)
                except BaseException as err:
                    for other in cores.values():
                        if other is not core:
                            other.process.kill()
                    if role == "prefill" and isinstance(err, ValueError):
                        raise ValueError(f"prefill_config: {err}") from err
                    raise
                if message is not None:
                    ready[role] = message
        return ready["decode"]

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


KV_FIELDS = ("block_size", "dtype", "quantization", "quantization_group_size")  # what the K/V are: the pair's agree


def _check_pair(config: EngineConfig, prefill_config: EngineConfig) -> None:
    """A ValueError for a pair whose engines could not hand K/V over: each needs a paged prefix cache (the K/V
    arrive as cached blocks), one rank and the model's dtype in its cache (the connector moves plain tensors
    between single-rank engines), and both must compute the same K/V in the same blocks — a block of another
    size breaks the decode core, another dtype or quantization silently serves another model's K/V. The decode
    engine speculates with n-grams, not a draft model (whose K/V nobody sends)."""
    for name, c in (("config", config), ("prefill_config", prefill_config)):
        if not isinstance(c, EngineConfig) or c.kv != "paged" or not c.prefix_cache:
            raise ValueError(f"{name} must be an EngineConfig with kv='paged' and prefix_cache=True: the K/V "
                             "arrive as cached blocks")
        if c.kv_cache_dtype != "auto" or c.tensor_parallel_size != 1:
            raise ValueError(f"{name}: disaggregation moves K/V in the model's dtype between single-rank engines: "
                             "kv_cache_dtype='auto' and tensor_parallel_size=1")
    if config.speculative is not None and config.speculative.method == "draft":
        raise ValueError("config: a draft model's K/V live in the same blocks as the target's, and only the target's "
                         "arrive: the draft would read another request's entries for the prompt (worse guesses, "
                         "never wrong tokens); use SpeculativeConfig('ngram') on a disaggregated decode engine")
    fields = KV_FIELDS if config.quantization == "int4" else KV_FIELDS[:-1]  # a group size matters to int4 only
    differ = [f"{f}={getattr(prefill_config, f)!r} / {getattr(config, f)!r}" for f in fields
              if getattr(prefill_config, f) != getattr(config, f)]
    if differ:
        raise ValueError(f"prefill_config and config must compute the same K/V in the same blocks (the decode engine "
                         f"adopts the prefill engine's as its own): {', '.join(differ)}")
