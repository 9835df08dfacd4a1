"""Proposers: who guesses the next tokens a request's target model will produce.

Both take the decoding requests of a step with how many tokens each may draft (k, fewer near its
limits) and return a `Proposal` per request:

* `NgramProposer` — prompt lookup (`minillm/speculative/ngram.py`): no model, no state, guesses
  deterministically (one-hot distributions).
* `DraftModelProposer` — a small model with the target's tokenizer runs k times per step on all the
  requests at once, sampling (or taking the argmax, for greedy requests) exactly as the target
  would. It keeps its own KV cache, one contiguous slot per batch slot. After the target's verdict
  that cache may hold drafted tokens the target rejected: the next proposal keeps only the prefix
  that still matches the request's tokens — its rollback — and feeds the rest again.

    request tokens  t0 … t9 | drafted d1 d2 d3 d4       draft cache holds t0 … t9 d1 d2 d3 (d4 never fed)
    verdict: d1 d2 kept, then the target's own x        request tokens now t0 … t9 d1 d2 x
    next proposal: the cache's first 12 tokens still match (t0 … t9 d1 d2): feed x, then draft again
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minillm.attention import ContiguousKVCache
from minillm.config import SpeculativeConfig
from minillm.model.decoder import CausalLM
from minillm.request import Request
from minillm.sampling import SamplingParams, filtered_logits
from minillm.speculative.ngram import propose_ngram

Sampling = dict[str, tuple[SamplingParams, torch.Generator | None]]  # request id -> its params and generator


@dataclass
class Proposal:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # (len(token_ids), vocab): what each was drawn from; None: a deterministic
    #                                    guess (n-gram, or a greedy request), checked against the target's argmax
    #                                    or accepted with the target's probability


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.n_max, self.n_min = config.ngram_max, config.ngram_min

    def propose(self, requests: list[tuple[Request, int]], sampling: Sampling) -> dict[str, Proposal]:
        return {r.request_id: Proposal(propose_ngram(r.all_token_ids, k, self.n_max, self.n_min))
                for r, k in requests if k > 0}

    def keep_only(self, request_ids: set[str]) -> None:
        """Nothing to forget: the n-gram proposer keeps no state."""


@dataclass
class _Held:
    """What one request's slot of the draft cache holds: its first `base` tokens, then `drafted`.
    `owner`: the request they belong to (an id can come back as another request after an abort)."""

    owner: Request
    slot: int
    base: int
    drafted: list[int] = field(default_factory=list)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading entries still match the request's tokens (the rest are rolled back)."""
        n = min(self.base, len(tokens))
        for guess in self.drafted:
            if n >= len(tokens) or tokens[n] != guess:
                break
            n += 1
        return n


class DraftModelProposer:
    def __init__(self, draft: CausalLM, num_slots: int, max_len: int):
        self.draft = draft
        self.cache = ContiguousKVCache.for_model(draft.config, num_slots, max_len, draft.dtype, draft.device)
        self.held: dict[str, _Held] = {}

    @torch.inference_mode()
    def propose(self, requests: list[tuple[Request, int]], sampling: Sampling) -> dict[str, Proposal]:
        """k draft passes over all the requests at once: the first feeds what each request's slot lacks
        (its whole prompt at first, later the last verdict's tokens), each next one the token just drafted."""
        todo = [(r, k, r.all_token_ids) for r, k in requests if k > 0]
        proposals = {r.request_id: Proposal([], None) for r, _, _ in todo}
        probs: dict[str, list[torch.Tensor]] = {r.request_id: [] for r, _, _ in todo}
        feeds = {}
        for request, _, tokens in todo:
            held = self.held.get(request.request_id)
            same = held is not None and held.owner is request and held.slot == request.slot
            start = held.valid_prefix(tokens) if same else 0
            start = min(start, len(tokens) - 1)  # the newest token is always fed: its logits draft the first guess
            feeds[request.request_id] = (start, tokens[start:])
            self.held[request.request_id] = _Held(request, request.slot, len(tokens))
        for round_ in range(max((k for _, k, _ in todo), default=0)):
            active = [(r, tokens) for r, k, tokens in todo if round_ < k]
            input_ids = [t for r, _ in active for t in feeds[r.request_id][1]]
            positions = [p for r, _ in active
                         for p in range(feeds[r.request_id][0], feeds[r.request_id][0] + len(feeds[r.request_id][1]))]
            device = self.draft.device
            backend = self.cache.batch([r.slot for r, _ in active], [feeds[r.request_id][0] for r, _ in active],
                                       [len(feeds[r.request_id][1]) for r, _ in active])
            hidden = self.draft(torch.tensor(input_ids, device=device), torch.tensor(positions, device=device), backend)
            ends = torch.tensor([len(feeds[r.request_id][1]) for r, _ in active], device=device).cumsum(0) - 1
            logits = self.draft.logits(hidden[ends])  # (len(active), vocab)
            for (request, _), row in zip(active, logits):
                rid = request.request_id
                params, generator = sampling[rid]
                if params.greedy:
                    token = int(row.argmax())
                else:
                    q = filtered_logits(row, params).softmax(dim=-1)
                    token = int(torch.multinomial(q, 1, generator=generator))
                    probs[rid].append(q)
                proposals[rid].token_ids.append(token)
                start, fed = feeds[rid]
                feeds[rid] = (start + len(fed), [token])  # the next round feeds the guess just drafted
        for request, k, _ in todo:
            rid = request.request_id
            self.held[rid].drafted = proposals[rid].token_ids[: k - 1]  # the last guess was never fed
            if probs[rid]:
                proposals[rid].probs = torch.stack(probs[rid])
        return proposals

    def keep_only(self, request_ids: set[str]) -> None:
        """Forget every other request: it finished, or lost its slot (preempted), whose draft cache is
        then no longer its own."""
        for request_id in [rid for rid in self.held if rid not in request_ids]:
            del self.held[request_id]
