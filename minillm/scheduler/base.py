"""What both schedulers share: the queues, the slots, and how a step's results are applied.

A scheduler never touches tensors. `schedule()` returns a `SchedulerOutput`; the engine runs it and
hands the sampled tokens back through `update()`, which advances each request. The engine then
judges who is done (it holds the text that stop strings need) and retires them with `finish()`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from minillm.kv.block_pool import BlockPool
from minillm.request import Request, RequestStatus
from minillm.scheduler.output import ScheduledChunk, SchedulerOutput

FINAL_STATUS = {"abort": RequestStatus.ABORTED, "error": RequestStatus.FAILED}  # others: FINISHED


class Scheduler:
    def __init__(self, max_num_seqs: int, max_model_len: int, max_tokens_per_step: int,
                 pool: BlockPool | None = None, max_prefill_chunk: int | None = None):
        self.pool = pool  # the paged cache's bookkeeping; None with a contiguous cache
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_tokens_per_step = max_tokens_per_step
        self.max_prefill_chunk = max_prefill_chunk  # chunked prefill (chapter 6); None: a prompt in one step
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots: list[int] = list(range(max_num_seqs))
        self._finished_ids: list[str] = []  # reported to the runner in the next output

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
        # a decode runs exactly the newest token, a generated one; anything else computes tokens the
        # request already had: its prompt, or (after a preemption) its prompt and earlier output
        decode = num_tokens == 1 and start == request.num_tokens - 1 and start >= request.num_prompt_tokens
        return ScheduledChunk(request.request_id, request.slot, start, tuple(request.all_token_ids[start:end]),
                              samples=end == request.num_tokens, is_prefill=not decode, block_table=blocks)

    def _output(self, chunks: list[ScheduledChunk], new: list[Request], preempted: list[str] = ()) -> SchedulerOutput:
        finished, self._finished_ids = tuple(self._finished_ids), []
        return SchedulerOutput(tuple(chunks), tuple(new), finished, tuple(preempted))

    # ------------------------------------------------------------------ results
    def update(self, output: SchedulerOutput, sampled: Mapping[str, int]) -> list[Request]:
        """Apply one step: count the computed tokens and append the sampled ones. Returns the
        requests that received a token this step (the engine then decides who is done)."""
        by_id = {r.request_id: r for r in self.running}
        advanced = []
        for chunk in output.chunks:
            request = by_id.get(chunk.request_id)
            if request is None:  # aborted or failed while the step ran
                continue
            request.num_computed_tokens += chunk.num_tokens
            if self.pool is not None:  # with a prefix cache, its newly full blocks become findable
                self.pool.cache_full_blocks(request.request_id, request.all_token_ids, request.num_computed_tokens)
            if chunk.samples:
                request.output_token_ids.append(sampled[chunk.request_id])
                advanced.append(request)
        return advanced

    def finish(self, request: Request, reason: str) -> None:
        """End a running or waiting request (`reason`: stop / length / abort / error) and give back
        its slot and KV blocks. A request that is already done is left as it is."""
        if request.status.is_done:
            return
        if self.pool is not None and request.request_id in self.pool.tables:
            self.pool.free(request.request_id)  # first: a request is never done while it still holds blocks
        request.finish_reason = reason
        request.status = FINAL_STATUS.get(reason, RequestStatus.FINISHED)
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self._release_slot(request)
        self._finished_ids.append(request.request_id)

    def _release_slot(self, request: Request) -> None:
        self.free_slots.append(request.slot)
        self.free_slots.sort()
