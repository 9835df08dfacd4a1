"""Continuous (iteration-level) batching, chapter 3 — and its paged-KV form, chapter 4.

Every step, within the token budget:
  1. every running request gets the tokens it needs next — one (decode) or its prompt (prefill);
  2. waiting requests are admitted, first come first served, while a slot is free and their whole
     prompt fits in what is left of the budget.
Prefill and decode then run in ONE forward pass. There is no phase flag: a request's
`num_computed_tokens` says how many of its tokens are cached, and it is granted the rest.

With chunked prefill (chapter 6, `max_prefill_chunk`), nobody is granted more than one chunk of
its remaining tokens, and the step is filled in this order:
  1. decodes (requests needing one token) — so a newcomer's prompt never stalls them;
  2. prefills already in progress, oldest first, one chunk each;
  3. new requests, one chunk each, while budget and slots remain.
A chunk that ends before the request's last token samples nothing; the rest comes next step. A
prompt longer than the step budget is simply served over several steps.

With a paged cache (a `BlockPool`), a running request's table grows a block whenever its tokens
cross a block boundary. When the pool is empty, the NEWEST running request is **preempted by
recompute**: its blocks are freed, its `num_computed_tokens` drops to 0, and it goes back to the
front of the queue; when it returns, its prompt and the tokens it had generated are prefilled
again. A waiting request is admitted only if the pool can hold all its tokens — admission never
preempts anyone.

With a prefix cache (chapter 5), admission first looks the request's tokens up: its cached leading
full blocks are shared instead of computed, so its `num_computed_tokens` starts at the hit length
and only the rest counts against the budget and the pool. A preempted request finds its own
earlier blocks again this way, if they were not evicted meanwhile.
"""

from __future__ import annotations

import dataclasses

from minillm.request import Request, RequestStatus
from minillm.scheduler.base import Scheduler
from minillm.scheduler.output import SchedulerOutput


class ContinuousScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        budget = self.max_tokens_per_step
        chunks, new, preempted = [], [], []
        # oldest first; chunked, decodes before prefills in progress (a stable sort keeps each group
        # oldest first). Preemption takes from the newest end: never a request already served this step
        order = self.running if self.max_prefill_chunk is None else sorted(
            self.running, key=lambda r: r.num_uncomputed_tokens > 1)
        for request in list(order):
            grant = self._grant(request.num_uncomputed_tokens, budget)
            if request.status is not RequestStatus.RUNNING or grant == 0:
                continue  # preempted just now, or its turn comes next step
            preempted += self._make_room(request)
            if request.status is not RequestStatus.RUNNING:
                continue  # it was the newest: preempted itself
            chunks.append(self._chunk(request, grant))
            budget -= grant
        # admit while slots, budget and blocks allow (not in a step that had to preempt: no thrashing)
        # (a request whose structured output's grammar is still compiling waits, and lets others pass)
        passed = 0  # waiting requests passed over
        while len(self.waiting) > passed and not preempted:
            request = self.waiting[passed]
            if not request.is_ready:
                passed += 1
                continue
            if len(self.free_slots) < self.slots_needed(request):
                break
            # a request that wants every prompt token's logprob computes every one of them: no hit
            lookup = self.pool is not None and not request.wants_prompt_logits
            cached = self.pool.find_cached(request.all_token_ids) if lookup else []
            hit = len(cached) * self.pool.block_size if self.pool is not None else 0
            grant = self._grant(request.num_tokens - hit, budget)
            if grant == 0 or (self.pool is not None and not self.pool.can_allocate(request.num_tokens, cached)):
                break
            del self.waiting[passed]
            self._admit(request)
            if self.pool is not None:  # blocks for every token now: a prefill in progress never waits for memory
                self.pool.allocate(request.request_id, request.num_tokens, cached,
                                   readmitted=request.num_preemptions > 0)
                request.num_computed_tokens = hit
                if request.num_preemptions == 0:
                    request.num_cached_tokens = hit
            chunks.append(self._chunk(request, grant))
            budget -= grant
            new.append(request)
        if budget > 0:
            self._reserve_guesses(chunks, budget)
        return self._output(chunks, new, preempted)

    def _reserve_guesses(self, chunks: list, budget: int) -> None:
        """Speculative decoding: room for the guesses of the requests that sample this step (each
        `max_guesses`), reserved last from what is left of the budget and of the free blocks — they
        never delay another request's token, an admission, or cost anyone their blocks. The proposer
        fills the room after this (`ScheduledChunk.with_guesses`), for these requests only."""
        by_id = {r.request_id: r for r in self.running}
        for i, chunk in enumerate(chunks):
            request = by_id.get(chunk.request_id)
            if budget <= 0 or request is None or not request.max_guesses or not chunk.samples or chunk.forks:
                continue
            room = min(request.max_guesses, budget)
            if self.pool is not None:
                while room and not self.pool.can_hold(request.request_id, request.num_tokens + room):
                    room -= 1
                self.pool.append(request.request_id, request.num_tokens + room)
            if room:
                blocks = tuple(self.pool.block_table(request.request_id)) if self.pool is not None else ()
                chunks[i] = dataclasses.replace(chunk, block_table=blocks, num_lookahead=room)
                budget -= room

    def _grant(self, need: int, budget: int) -> int:
        """How many of `need` tokens a request runs this step: all of them if they fit the budget (0
        if not), or with chunked prefill at most one chunk of what is left of the budget."""
        if self.max_prefill_chunk is None:
            return need if need <= budget else 0
        return min(need, self.max_prefill_chunk, budget)

    def _make_room(self, request: Request) -> list[str]:
        """Give a running request the blocks for all its tokens — and a copy of any block it shares
        that this step writes into (copy-on-write) — preempting the newest running requests while
        the pool is short (`request` itself, if it is the newest). Returns the ids of the preempted."""
        if self.pool is None:
            return []
        preempted = []
        start, end = request.num_computed_tokens, request.num_tokens
        while not self.pool.can_write(request.request_id, start, end):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return preempted
        self._block_copies += self.pool.prepare_write(request.request_id, start, end)
        return preempted

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._release_slot(request)
        for child in request.pending_forks:  # not forked yet: their reserved slots come back too
            self._release_slot(child)
            child.slot = None
        self.pool.free(request.request_id)
        request.slot = None
        request.num_computed_tokens = 0  # everything is recomputed when it comes back
        request.max_guesses = 0  # and guessed anew
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.waiting.appendleft(request)
