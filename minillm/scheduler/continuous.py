"""Continuous (iteration-level) batching, chapter 3.

Every step, within the token budget:
  1. every running request gets the tokens it needs next — one (decode) or its prompt (prefill);
  2. waiting requests are admitted, first come first served, while a slot is free and their whole
     prompt fits in what is left of the budget.
Prefill and decode then run in ONE forward pass. There is no phase flag: a request's
`num_computed_tokens` says how many of its tokens are cached, and it is granted the rest.
"""

from __future__ import annotations

from minillm.scheduler.base import Scheduler
from minillm.scheduler.output import SchedulerOutput


class ContinuousScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        budget = self.max_tokens_per_step
        chunks, new = [], []
        for request in self.running:
            need = request.num_uncomputed_tokens
            if need > budget:
                continue  # its turn comes next step
            chunks.append(self._chunk(request, need))
            budget -= need
        while self.waiting and self.free_slots and self.waiting[0].num_uncomputed_tokens <= budget:
            request = self.waiting.popleft()
            self._admit(request)
            chunks.append(self._chunk(request, request.num_uncomputed_tokens))
            budget -= request.num_uncomputed_tokens
            new.append(request)
        return self._output(chunks, new)
