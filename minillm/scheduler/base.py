"""What both schedulers share: the queues, the slots, and how a step's results are applied.

A scheduler never touches tensors. `schedule()` returns a `SchedulerOutput`; the engine runs it and
hands the sampled tokens back through `update()`, which advances each request and retires the
finished ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

from minillm.kv.block_pool import BlockPool
from minillm.request import Request, RequestStatus
from minillm.scheduler.output import ScheduledChunk, SchedulerOutput
from minillm.stopping import stop_reason


class Scheduler:
    def __init__(self, max_num_seqs: int, max_model_len: int, max_tokens_per_step: int,
                 eos_token_ids: Collection[int], pool: BlockPool | None = None):
        self.pool = pool  # the paged cache's bookkeeping; None with a contiguous cache
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_tokens_per_step = max_tokens_per_step
        self.eos_token_ids = tuple(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots: list[int] = list(range(max_num_seqs))
        self._finished_ids: list[str] = []  # reported to the runner in the next output
        self._preempted_ids: list[str] = []  # reported in the next output (for the trace)

    # ------------------------------------------------------------------ queue
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def slot_owners(self) -> dict[int, str]:
        """Which request holds each occupied slot (for the trace)."""
        return {r.slot: r.request_id for r in self.running}

    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers for schedule()
    def _admit(self, request: Request) -> None:
        request.slot = self.free_slots.pop(0)
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _chunk(self, request: Request, num_tokens: int) -> ScheduledChunk:
        start = request.num_computed_tokens
        end = start + num_tokens
        blocks = tuple(self.pool.block_table(request.request_id)) if self.pool is not None else ()
        return ScheduledChunk(request.request_id, request.slot, start, tuple(request.all_token_ids[start:end]),
                              samples=end == request.num_tokens, is_prefill=start < request.num_prompt_tokens,
                              block_table=blocks)

    def _output(self, chunks: list[ScheduledChunk], new: list[Request]) -> SchedulerOutput:
        finished, self._finished_ids = tuple(self._finished_ids), []
        preempted, self._preempted_ids = tuple(self._preempted_ids), []
        return SchedulerOutput(tuple(chunks), tuple(new), finished, preempted)

    # ------------------------------------------------------------------ results
    def update(self, output: SchedulerOutput, sampled: Mapping[str, int]) -> list[Request]:
        """Apply one step: count the computed tokens, append the sampled ones, retire the finished.
        Returns the requests that received a token this step."""
        by_id = {r.request_id: r for r in self.running}
        advanced = []
        for chunk in output.chunks:
            request = by_id.get(chunk.request_id)
            if request is None:  # aborted while the step ran
                continue
            request.num_computed_tokens += chunk.num_tokens
            if chunk.samples:
                request.output_token_ids.append(sampled[chunk.request_id])
                advanced.append(request)
                reason = stop_reason(request.output_token_ids, request.num_prompt_tokens, request.params,
                                     self.eos_token_ids, self.max_model_len)
                if reason is not None:
                    self.finish(request, reason)
        return advanced

    def finish(self, request: Request, reason: str) -> None:
        """End a running or waiting request (`reason`: stop / length / abort)."""
        if request.status.is_done:
            return
        request.finish_reason = reason
        request.status = RequestStatus.ABORTED if reason == "abort" else RequestStatus.FINISHED
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self._release_slot(request)
        if self.pool is not None and request.request_id in self.pool.tables:
            self.pool.free(request.request_id)
        self._finished_ids.append(request.request_id)

    def _release_slot(self, request: Request) -> None:
        self.free_slots.append(request.slot)
        self.free_slots.sort()
