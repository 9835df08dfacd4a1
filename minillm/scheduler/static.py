"""Static batching, chapter 2 — the "before" picture.

Requests are taken in batches of up to `max_num_seqs`, prefilled together, and decoded together
until the LAST of them finishes. A request that finishes early leaves its slot idle: nobody may
take it until the whole batch is done. (A dense implementation would also pad every prompt to the
longest; minillm's flat batch needs no padding, so the waste shows up only as idle slots.)
"""

from __future__ import annotations

from minillm.request import Request
from minillm.scheduler.base import Scheduler
from minillm.scheduler.output import SchedulerOutput


class StaticScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch: list[Request] = []  # the current batch, finished members included

    def schedule(self) -> SchedulerOutput:
        new = []
        if not self.running:  # the whole batch is done: its slots come back, a new batch forms
            self.free_slots = sorted(self.free_slots + [r.slot for r in self.batch])
            self.batch = []
            budget = self.max_tokens_per_step
            while self.waiting and self.free_slots and self.waiting[0].num_uncomputed_tokens <= budget:
                request = self.waiting.popleft()
                budget -= request.num_uncomputed_tokens
                self._admit(request)
                self.batch.append(request)
                new.append(request)
        chunks = [self._chunk(r, r.num_uncomputed_tokens) for r in self.running]
        return self._output(chunks, new)

    def _release_slot(self, request: Request) -> None:
        pass  # the slot stays with the batch until every member has finished

    def slot_owners(self) -> dict[int, str]:
        return {r.slot: r.request_id for r in self.batch}
