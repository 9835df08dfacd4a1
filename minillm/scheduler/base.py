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
        self._block_copies: list[tuple[int, int]] = []  # copy-on-write, done by the runner before the next pass
        self._slot_copies: list[tuple[int, int, int]] = []  # forks on a contiguous cache, likewise

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
    def slots_needed(self, request: Request) -> int:
        """Slots `request` takes when admitted: its own, and one reserved for each sample still to fork
        from it (so that a fork never waits for a slot)."""
        return 1 + len(request.pending_forks)

    def _admit(self, request: Request) -> None:
        request.slot = self.free_slots.pop(0)
        for child in request.pending_forks:
            child.slot = self.free_slots.pop(0)
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _chunk(self, request: Request, num_tokens: int) -> ScheduledChunk:
        start = request.num_computed_tokens
        end = start + num_tokens
        blocks = tuple(self.pool.block_table(request.request_id)) if self.pool is not None else ()
        # a decode runs exactly the newest token, a generated one (guesses are added later); anything
        # else computes tokens the request already had: its prompt, or after a preemption its output too
        decode = num_tokens == 1 and start == request.num_tokens - 1 and start >= request.num_prompt_tokens
        tokens = tuple(request.token_slice(start, end))
        samples = end == request.num_tokens
        forks = tuple(c.request_id for c in request.pending_forks) if samples else ()
        return ScheduledChunk(request.request_id, request.slot, start, tokens, samples=samples,
                              is_prefill=not decode, block_table=blocks, forks=forks)

    def _output(self, chunks: list[ScheduledChunk], new: list[Request], preempted: list[str] = ()) -> SchedulerOutput:
        finished, self._finished_ids = tuple(self._finished_ids), []
        block_copies, self._block_copies = tuple(self._block_copies), []
        slot_copies, self._slot_copies = tuple(self._slot_copies), []
        return SchedulerOutput(tuple(chunks), tuple(new), finished, tuple(preempted), block_copies, slot_copies)

    # ------------------------------------------------------------------ results
    def update(self, output: SchedulerOutput, sampled: Mapping[str, list[int]]) -> list[tuple[Request, int]]:
        """Apply one step: count the computed tokens and append the new ones. Returns the requests
        that received tokens this step, with how many (the engine then decides who is done).

        With speculative decoding a chunk [last, d1 … dk] that kept a guesses and one token of the
        target's own has computed the K/V of `last` and d1 … da: the rejected guesses' K/V are
        simply not counted (they will be overwritten), and blocks past the request's tokens go back
        to the pool."""
        by_id = {r.request_id: r for r in self.running}
        advanced = []
        for chunk in output.chunks:
            request = by_id.get(chunk.request_id)
            if request is None:  # aborted or failed while the step ran
                continue
            new = sampled[chunk.request_id] if chunk.samples else []
            accepted = len(new) - 1 if chunk.num_drafts else 0
            request.num_computed_tokens += chunk.num_tokens - chunk.num_drafts + accepted
            request.output_token_ids.extend(new)
            request.max_guesses = 0
            if self.pool is not None:
                if self.pool.cache is not None:  # with a prefix cache, its newly full blocks become findable —
                    # but after a verification that kept every guess, the block holding the last one waits a
                    # step: a draft model feeds that guess only next step (minillm/speculative/proposers.py)
                    kept_all = chunk.num_drafts and accepted == chunk.num_drafts
                    self.pool.cache_full_blocks(request.request_id, request.all_token_ids,
                                                request.num_computed_tokens - kept_all)
                if chunk.num_lookahead:  # blocks reserved for guesses not kept (or never made)
                    self.pool.truncate(request.request_id, request.num_tokens)
            if new:
                advanced.append((request, len(new)))
            for child_id in chunk.forks if new else ():
                child = next((c for c in request.children if c.request_id == child_id), None)
                if child is not None and child.is_fork_pending and child_id in sampled:
                    self._fork(request, child, sampled[child_id])
                    advanced.append((child, 1))
        return advanced

    def _fork(self, parent: Request, child: Request, first_tokens: list[int]) -> None:
        """Sample `child` starts where its parent's prompt ends: it shares the parent's K/V (its blocks,
        or on a contiguous cache a copy into its reserved slot) and has its own first token."""
        child.num_computed_tokens = parent.num_prompt_tokens
        child.output_token_ids.extend(first_tokens)
        child.status = RequestStatus.RUNNING
        if self.pool is not None:
            self.pool.fork(parent.request_id, child.request_id)
        else:
            self._slot_copies.append((parent.slot, child.slot, parent.num_prompt_tokens))
        self.running.append(child)

    def finish(self, request: Request, reason: str) -> None:
        """End a running or waiting request (`reason`: stop / length / abort / error) and give back
        its slot and KV blocks. A request that is already done is left as it is."""
        if request.status.is_done:
            return
        if self.pool is not None and request.request_id in self.pool.tables:
            self.pool.free(request.request_id)  # first: a request is never done while it still holds blocks
        reserved = request.is_fork_pending and request.slot is not None  # a sample that never forked
        request.finish_reason = reason
        request.status = FINAL_STATUS.get(reason, RequestStatus.FINISHED)
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self._release_slot(request)
        elif reserved:  # its reserved slot comes back
            self._release_slot(request)
            request.slot = None
        self._finished_ids.append(request.request_id)

    def _release_slot(self, request: Request) -> None:
        self.free_slots.append(request.slot)
        self.free_slots.sort()
