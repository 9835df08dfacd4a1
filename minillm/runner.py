"""The model runner: turns a SchedulerOutput into one forward pass and samples the next tokens.

It makes no scheduling decisions. It keeps only what sampling needs per request (its params and
its seeded generator), set up when the request is admitted and dropped when it finishes. Sampling
is isolated per request: a row that raises fails its own request, and its neighbours' tokens (and
seeded generators) are exactly what they would have been without it.

    chunks:     A: prefill 5 tokens     B: decode 1     C: decode 1
    input_ids:  [a0 a1 a2 a3 a4 | b7 | c3]                 one flat batch
    positions:  [ 0  1  2  3  4 |  7 |  3]
    logits of:               ^     ^    ^                  the last row of each sampling chunk
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from minillm.attention import ContiguousKVCache
from minillm.attention.paged import PagedKVCache
from minillm.model.decoder import CausalLM
from minillm.sampling import SamplingParams, sample
from minillm.scheduler.output import SchedulerOutput


@dataclass
class StepResult:
    sampled: dict[str, int] = field(default_factory=dict)  # request id -> its new token
    failed: dict[str, Exception] = field(default_factory=dict)  # request id -> why it got none


class ModelRunner:
    def __init__(self, model: CausalLM, cache: ContiguousKVCache | PagedKVCache):
        self.model, self.cache = model, cache
        self.sampling: dict[str, tuple[SamplingParams, torch.Generator | None]] = {}

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> StepResult:
        """Run one step: a new token for each chunk that samples (or the error its sampling raised).
        An error of the forward pass itself propagates: it belongs to the whole batch."""
        device = self.model.device
        for request_id in output.finished_ids:  # first: a finished request's id may be reused by a new one
            self.sampling.pop(request_id, None)
        for request in output.new_requests:  # a preempted request comes back with its generator as it was
            if request.request_id not in self.sampling:
                self.sampling[request.request_id] = (request.params, request.params.make_generator(device))
        if output.is_empty:
            return StepResult()
        chunks = output.chunks
        input_ids = torch.tensor([t for c in chunks for t in c.token_ids], device=device)  # (num_tokens,)
        positions = torch.tensor([p for c in chunks for p in range(c.start, c.start + c.num_tokens)], device=device)
        where = [c.block_table for c in chunks] if isinstance(self.cache, PagedKVCache) else [c.slot for c in chunks]
        backend = self.cache.batch(where, [c.start for c in chunks], [c.num_tokens for c in chunks])
        hidden = self.model(input_ids, positions, backend)  # (num_tokens, hidden)
        last_rows = [end - 1 for end in itertools.accumulate(c.num_tokens for c in chunks)]
        sampling = [(c, row) for c, row in zip(chunks, last_rows) if c.samples]
        if not sampling:
            return StepResult()
        logits = self.model.logits(hidden[[row for _, row in sampling]])  # (num_sampling, vocab)
        greedy_ids = logits.argmax(dim=-1).tolist()  # every greedy row in one call
        result = StepResult()
        for (chunk, _), row, greedy_id in zip(sampling, logits, greedy_ids):
            params, generator = self.sampling[chunk.request_id]
            try:  # the others draw with their own generators: one failing row changes nothing for them
                result.sampled[chunk.request_id] = greedy_id if params.greedy else sample(row, params, generator)
            except Exception as err:
                result.failed[chunk.request_id] = err
        return result
