"""Static batching, chapter 2 — the "before" picture.

Requests are taken in batches of up to `max_num_seqs`, prefilled together, and decoded together
until the LAST of them finishes. The batch keeps its shape while it lives: a request that finishes
early keeps its slot *and* its row of every forward pass, where it runs a pad token whose result is
thrown away — exactly what `transformers.generate` does with a padded batch. Nobody may take the
slot until the whole batch is done. (A dense implementation would also pad every prompt to the
longest; minillm's flat batch needs no prompt padding.)
"""

from __future__ import annotations

from minillm.request import Request
from minillm.scheduler.base import Scheduler
from minillm.scheduler.output import ScheduledChunk, SchedulerOutput

PAD_TOKEN_ID = 0  # what a finished row runs; any id would do, its logits are never read


class StaticScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch: list[Request] = []  # the current batch, finished members included

    def schedule(self) -> SchedulerOutput:
        new = []
        if not self.running:  # the last batch is done (its slots came back): a new batch forms
            budget = self.max_tokens_per_step
            passed = 0  # waiting requests passed over: their structured output's grammar is still compiling
            while len(self.waiting) > passed and self.free_slots:
                request = self.waiting[passed]
                if not request.is_ready:
                    passed += 1
                    continue
                if request.num_uncomputed_tokens > budget:
                    break
                del self.waiting[passed]
                budget -= request.num_uncomputed_tokens
                self._admit(request)
                self.batch.append(request)
                new.append(request)
        chunks = [self._chunk(r, r.num_uncomputed_tokens) if not r.status.is_done else self._padding(r)
                  for r in self.batch if self.running]
        return self._output(chunks, new)

    def _padding(self, request: Request) -> ScheduledChunk:
        """A finished member's row: one pad token at a position inside its own (dead) slot."""
        position = min(request.num_computed_tokens, self.max_model_len - 1)
        return ScheduledChunk(request.request_id, request.slot, position, (PAD_TOKEN_ID,), samples=False,
                              is_prefill=False, is_padding=True)

    def _release_slot(self, request: Request) -> None:
        """A member's slot stays with the batch until every member has finished; then all come back."""
        if not self.running:
            self.free_slots = sorted(self.free_slots + [r.slot for r in self.batch])
            self.batch = []

    def slot_owners(self) -> dict[int, str]:
        return {r.slot: r.request_id for r in self.batch}
