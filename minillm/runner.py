"""The model runner: turns a SchedulerOutput into one forward pass and samples the next tokens.

It makes no scheduling decisions. It keeps only what sampling needs per request (its params and
its seeded generator), set up when the request is admitted and dropped when it finishes.

    chunks:     A: prefill 5 tokens     B: decode 1     C: decode 1
    input_ids:  [a0 a1 a2 a3 a4 | b7 | c3]                 one flat batch
    positions:  [ 0  1  2  3  4 |  7 |  3]
    logits of:               ^     ^    ^                  the last row of each sampling chunk
"""

from __future__ import annotations

import itertools

import torch

from minillm.attention import ContiguousKVCache
from minillm.attention.paged import PagedKVCache
from minillm.model.decoder import CausalLM
from minillm.sampling import SamplingParams, sample_batch
from minillm.scheduler.output import SchedulerOutput


class ModelRunner:
    def __init__(self, model: CausalLM, cache: ContiguousKVCache | PagedKVCache):
        self.model, self.cache = model, cache
        self.sampling: dict[str, tuple[SamplingParams, torch.Generator | None]] = {}

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns {request_id: sampled token} for the chunks that sample."""
        device = self.model.device
        for request_id in output.finished_ids:  # first: a finished request's id may be reused by a new one
            self.sampling.pop(request_id, None)
        for request in output.new_requests:  # a preempted request comes back with its generator as it was
            if request.request_id not in self.sampling:
                self.sampling[request.request_id] = (request.params, request.params.make_generator(device))
        if output.is_empty:
            return {}
        chunks = output.chunks
        input_ids = torch.tensor([t for c in chunks for t in c.token_ids], device=device)  # (num_tokens,)
        positions = torch.tensor([p for c in chunks for p in range(c.start, c.start + c.num_tokens)], device=device)
        where = [c.block_table for c in chunks] if isinstance(self.cache, PagedKVCache) else [c.slot for c in chunks]
        backend = self.cache.batch(where, [c.start for c in chunks], [c.num_tokens for c in chunks])
        hidden = self.model(input_ids, positions, backend)  # (num_tokens, hidden)
        last_rows = [end - 1 for end in itertools.accumulate(c.num_tokens for c in chunks)]
        sampling = [(c, row) for c, row in zip(chunks, last_rows) if c.samples]
        if not sampling:
            return {}
        logits = self.model.logits(hidden[[row for _, row in sampling]])  # (num_sampling, vocab)
        state = [self.sampling[c.request_id] for c, _ in sampling]
        tokens = sample_batch(logits, [p for p, _ in state], [g for _, g in state])
        return {c.request_id: t for (c, _), t in zip(sampling, tokens)}
