"""What the scheduler decides for one step: plain data, fully built before the model runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from minillm.request import Request


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one request to run in this step.

        request:  | computed (start tokens) | token_ids (this step) | ...
                   0                     start                start + len(token_ids)

    A prefill chunk brings the prompt (all of it, or with chunked prefill a piece of it), or after
    a preemption the tokens to recompute; a decode chunk the one token sampled last step — with
    speculative decoding followed by the proposer's guesses, all verified in this pass. The
    scheduler reserves room for them (`num_lookahead`: budget and blocks); the proposer, which runs
    after scheduling, fills it (`with_guesses`) with as many as it has. When the
    chunk reaches the request's newest token (`samples`), its last logits give the next token.
    A padding chunk is a finished member of a static batch: it still occupies its row of the
    batch, so it runs one pad token whose result is thrown away.
    """

    request_id: str
    slot: int
    start: int
    token_ids: tuple[int, ...]
    samples: bool
    is_prefill: bool
    is_padding: bool = False
    block_table: tuple[int, ...] = ()  # with a paged cache: the request's blocks, enough for start + len
    num_drafts: int = 0  # speculative decoding: the last num_drafts of token_ids are guesses to verify
    num_lookahead: int = 0  # ...the most guesses it may carry: the budget and blocks reserved for them
    forks: tuple[str, ...] = ()  # n samples: the other samples whose first token these last logits also give

    @property
    def draft_token_ids(self) -> tuple[int, ...]:
        return self.token_ids[len(self.token_ids) - self.num_drafts :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def with_guesses(self, guesses: Sequence[int]) -> ScheduledChunk:
        """This chunk carrying the proposer's guesses after its own tokens (at most `num_lookahead`)."""
        if self.num_drafts or len(guesses) > self.num_lookahead:
            raise ValueError(f"a chunk with room for {self.num_lookahead} guesses (and {self.num_drafts} already) "
                             f"cannot take {len(guesses)}")
        return dataclasses.replace(self, token_ids=self.token_ids + tuple(guesses), num_drafts=len(guesses))


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...]
    new_requests: tuple[Request, ...]  # admitted this step: the runner sets up their sampling state
    finished_ids: tuple[str, ...]  # ended since the last step: the runner forgets them
    preempted_ids: tuple[str, ...] = ()  # lost their KV blocks this step; they wait to recompute
    block_copies: tuple[tuple[int, int], ...] = ()  # paged: (source, copy) blocks to copy before the pass
    #                                                 (copy-on-write of a block shared by n samples)
    slot_copies: tuple[tuple[int, int, int], ...] = ()  # contiguous: (source slot, slot, tokens) to copy first
    #                                                     (a fork: the prompt's K/V into each sample's slot)

    @property
    def num_tokens(self) -> int:
        """Tokens the forward pass runs, padding included."""
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def has_copies(self) -> bool:
        return bool(self.block_copies or self.slot_copies)
