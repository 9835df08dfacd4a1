"""Proposers: who guesses the next tokens a request's target model will produce.

Both run after the scheduler has planned the step, for the requests it left room for guesses
(`ScheduledChunk.num_lookahead`: budget and KV blocks reserved) and for them only, and return a
`Proposal` per request with at most that many guesses:

* `NgramProposer` — prompt lookup (`minillm/speculative/ngram.py`): no model, no state, guesses
  deterministically (one-hot distributions).
* `DraftModelProposer` — a small model with the target's tokenizer. Its KV cache *mirrors* the
  target's: the same slots, or with a paged cache the same block ids (each block holds the
  target's K/V and the draft's for the same tokens, so its pool, preemption, prefix sharing and
  copy-on-write serve both, and the two share one memory budget). Its first pass runs on the
  step's chunks themselves — the prefill chunks exactly as the target's pass will run them, so its
  prefill is chunked like the target's — and drafts each verifying request's first guess; each next
  pass feeds the requests' previous guesses. Guesses are drawn as the target would draw (argmax for
  a greedy request, the same temperature / top-k / top-p / min-p otherwise), keeping the q they
  were drawn from for the acceptance rule.

Rollback costs nothing: the draft's entries for guesses the target refused lie past the request's
computed tokens and are written over. One entry can lag: when the target keeps every guess, the
last one was never fed to the draft (its pass would only have drafted a guess past the round), so
the next proposal feeds it first.

    request t0 … t9, guesses d1 d2 d3      draft wrote t9 (first pass), d1, d2; never d3
    verdict: all kept, then x              target computed t0 … t9 d1 d2 d3; draft holds up to d2
    next step: the chunk is [x]            the draft's first pass feeds [d3, x]

So that a prefix-cache hit never finds a block without its draft entries, the scheduler makes the
block holding such a last guess findable one step later (`Scheduler.update`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from minillm.attention import ContiguousKVCache
from minillm.attention.chunks import batch_for
from minillm.attention.paged import PagedKVCache
from minillm.config import SpeculativeConfig
from minillm.model.decoder import CausalLM
from minillm.request import Request
from minillm.sampling import SamplingParams, filtered_logits
from minillm.scheduler.output import ScheduledChunk, SchedulerOutput
from minillm.speculative.ngram import propose_ngram

Sampling = Mapping[str, tuple[SamplingParams, torch.Generator | None]]  # request id -> its params and generator


@dataclass
class Proposal:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # (len(token_ids), vocab): what each was drawn from; None: a deterministic
    #                                    guess (n-gram, or a greedy request), checked against the target's argmax
    #                                    or accepted with the target's probability


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.n_max, self.n_min = config.ngram_max, config.ngram_min

    def propose(self, output: SchedulerOutput, requests: Mapping[str, Request],
                sampling: Sampling) -> dict[str, Proposal]:
        return {c.request_id: Proposal(propose_ngram(requests[c.request_id].all_token_ids, c.num_lookahead,
                                                     self.n_max, self.n_min))
                for c in output.chunks if c.num_lookahead}

    def keep_only(self, request_ids: set[str]) -> None:
        """Nothing to forget: the n-gram proposer keeps no state."""


@dataclass
class _Held:
    """How far the draft's cache holds one request's tokens: its first `end` (entries past the
    request's computed tokens are refused guesses). `owner`: an id can come back as another request."""

    owner: Request
    end: int


class DraftModelProposer:
    def __init__(self, draft: CausalLM, cache: ContiguousKVCache | PagedKVCache):
        self.draft, self.cache = draft, cache  # cache: shaped for the draft, addressed like the target's
        self.held: dict[str, _Held] = {}

    @torch.inference_mode()
    def propose(self, output: SchedulerOutput, requests: Mapping[str, Request],
                sampling: Sampling) -> dict[str, Proposal]:
        """The draft's passes for one step: the first over every chunk (what the draft lacks of each
        request up to the chunk's end), then one per further guess over the requests still guessing."""
        if output.block_copies:  # the same copies the target's cache gets (copy-on-write, forks)
            self.cache.copy_blocks(list(output.block_copies))
        if output.slot_copies:
            self.cache.copy_slots(list(output.slot_copies))
        chunks = [c for c in output.chunks if not c.is_padding]
        feeds = []  # per chunk: (first position fed, tokens fed)
        for chunk in chunks:
            request = requests[chunk.request_id]
            held = self.held.get(chunk.request_id)
            start = min(held.end, chunk.start) if held is not None and held.owner is request else chunk.start
            feeds.append((start, request.token_slice(start, chunk.start) + list(chunk.token_ids)))
            self.held[chunk.request_id] = _Held(request, start)  # until the pass below has run
        guessing = [i for i, c in enumerate(chunks) if c.num_lookahead]
        logits = self._pass(chunks, feeds, guessing)
        for chunk, (start, tokens) in zip(chunks, feeds):
            self.held[chunk.request_id].end = start + len(tokens)
        proposals = {chunks[i].request_id: Proposal([]) for i in guessing}
        probs: dict[str, list[torch.Tensor]] = {rid: [] for rid in proposals}
        for round_ in range(max((chunks[i].num_lookahead for i in guessing), default=0)):
            if round_:  # feed each request's previous guess, one token after its last
                guessing = [i for i in guessing if chunks[i].num_lookahead > round_]
                feeds = {i: (self.held[chunks[i].request_id].end, [proposals[chunks[i].request_id].token_ids[-1]])
                         for i in guessing}
                logits = self._pass([chunks[i] for i in guessing], [feeds[i] for i in guessing], range(len(guessing)))
                for i in guessing:
                    self.held[chunks[i].request_id].end += 1
            for i, (token, q) in zip(guessing, self._draw(logits, [chunks[i].request_id for i in guessing], sampling)):
                proposals[chunks[i].request_id].token_ids.append(token)
                if q is not None:
                    probs[chunks[i].request_id].append(q)
        for request_id, drawn in probs.items():
            if drawn:
                proposals[request_id].probs = torch.stack(drawn)  # (guesses, vocab)
        return proposals

    def _pass(self, chunks: list[ScheduledChunk], feeds: list[tuple[int, list[int]]], rows) -> torch.Tensor:
        """One forward pass of the draft: chunk i's `feeds[i]` tokens from its position `feeds[i][0]`,
        in the target's slot or blocks. Returns the logits of the last token of each chunk in `rows`,
        (len(rows), vocab)."""
        device = self.draft.device
        input_ids = torch.tensor([t for _, tokens in feeds for t in tokens], device=device)
        backend = batch_for(self.cache, chunks, [start for start, _ in feeds], [len(tokens) for _, tokens in feeds])
        hidden = self.draft(input_ids, backend.positions, backend)  # (num_tokens, hidden)
        ends = torch.tensor([len(tokens) for _, tokens in feeds], device=device).cumsum(0) - 1
        return self.draft.logits(hidden[ends[list(rows)]])

    @staticmethod
    def _draw(logits: torch.Tensor, request_ids: list[str],
              sampling: Sampling) -> list[tuple[int, torch.Tensor | None]]:
        """Each row's guess, with the distribution it was drawn from (None for a greedy request's
        argmax). One host sync for the whole batch."""
        chosen, dists = logits.argmax(dim=-1), []  # (rows,)
        for row, request_id in enumerate(request_ids):
            params, generator = sampling[request_id]
            if params.greedy:
                dists.append(None)
                continue
            q = filtered_logits(logits[row].float(), params).softmax(dim=-1)
            chosen[row] = torch.multinomial(q, 1, generator=generator)[0]
            dists.append(q)
        return list(zip(chosen.tolist(), dists))

    def keep_only(self, request_ids: set[str]) -> None:
        """Forget every other request: it finished, or was preempted (its blocks, and so its draft
        entries, may go to someone else)."""
        for request_id in [rid for rid in self.held if rid not in request_ids]:
            del self.held[request_id]
