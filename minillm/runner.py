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
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from minillm.attention import ContiguousKVCache
from minillm.attention.paged import PagedKVCache
from minillm.graphs.recorded_decode import RecordedDecode
from minillm.model.decoder import CausalLM
from minillm.sampling import SamplingParams, filtered_logits, sample
from minillm.scheduler.output import SchedulerOutput
from minillm.speculative.acceptance import accept_greedy, accept_sampled
from minillm.speculative.proposers import Proposal


@dataclass
class StepResult:
    sampled: dict[str, list[int]] = field(default_factory=dict)  # request id -> its new token(s): one, or with
    #                                                               speculation the kept guesses and one more
    failed: dict[str, Exception] = field(default_factory=dict)  # request id -> why it got none
    bucket: int | None = None  # the recorded step's batch size, when the step ran one (chapter 8)


class ModelRunner:
    def __init__(self, model: CausalLM, cache: ContiguousKVCache | PagedKVCache,
                 recorded: RecordedDecode | None = None):
        self.model, self.cache = model, cache
        self.recorded = recorded  # pure-decode steps through a CUDA Graph or a compiled step (chapter 8)
        self.sampling: dict[str, tuple[SamplingParams, torch.Generator | None]] = {}

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, proposals: Mapping[str, Proposal] | None = None) -> StepResult:
        """Run one step: new tokens for each chunk that samples (or the error its sampling raised).
        A chunk with guesses (speculative decoding) is verified here against its `proposals` entry.
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
        recorded = self.recorded.run(chunks) if self.recorded is not None and self.recorded.accepts(chunks) else None
        if recorded is not None:  # one row per chunk; keep the sampling ones
            all_logits, bucket = recorded
            logits = all_logits[[i for i, c in enumerate(chunks) if c.samples]]  # (num_rows, vocab)
        else:
            logits, bucket = self._eager_logits(chunks, device), None
        sampling = [c for c in chunks if c.samples]
        if not sampling:
            return StepResult(bucket=bucket)
        greedy_ids = logits.argmax(dim=-1).tolist()  # every greedy row in one call
        result, first = StepResult(bucket=bucket), 0
        for chunk in sampling:
            n = chunk.num_drafts + 1
            params, generator = self.sampling[chunk.request_id]
            try:  # the others draw with their own generators: one failing row changes nothing for them
                result.sampled[chunk.request_id] = self._new_tokens(chunk, params, generator, logits[first : first + n],
                                                                    greedy_ids[first : first + n], proposals)
            except Exception as err:
                result.failed[chunk.request_id] = err
            first += n
        return result

    def _eager_logits(self, chunks, device: torch.device) -> torch.Tensor:
        """The forward pass of any step (prefill, decode, chunks, guesses): logits of the rows that
        sample, (num_rows, vocab) — each sampling chunk's last real token, and its guesses."""
        input_ids = torch.tensor([t for c in chunks for t in c.token_ids], device=device)  # (num_tokens,)
        positions = torch.tensor([p for c in chunks for p in range(c.start, c.start + c.num_tokens)], device=device)
        where = [c.block_table for c in chunks] if isinstance(self.cache, PagedKVCache) else [c.slot for c in chunks]
        backend = self.cache.batch(where, [c.start for c in chunks], [c.num_tokens for c in chunks])
        hidden = self.model(input_ids, positions, backend)  # (num_tokens, hidden)
        ends = list(itertools.accumulate(c.num_tokens for c in chunks))
        rows = [r for c, end in zip(chunks, ends) if c.samples for r in range(end - 1 - c.num_drafts, end)]
        return self.model.logits(hidden[rows])

    @staticmethod
    def _new_tokens(chunk, params: SamplingParams, generator: torch.Generator | None, logits: torch.Tensor,
                    greedy_ids: list[int], proposals: Mapping[str, Proposal] | None) -> list[int]:
        """One token from the last row; or, after guesses, the acceptance rule over all the rows."""
        drafted = chunk.draft_token_ids
        if not drafted:
            return [greedy_ids[0] if params.greedy else sample(logits[0], params, generator)]
        if params.greedy:
            return accept_greedy(drafted, greedy_ids)
        target = filtered_logits(logits, params).softmax(dim=-1)  # (k + 1, vocab)
        proposal = proposals.get(chunk.request_id) if proposals is not None else None
        q = None  # the guesses were drawn from q; the scheduler may have kept only the first few of them
        if proposal is not None and proposal.probs is not None and proposal.token_ids[: len(drafted)] == list(drafted):
            q = proposal.probs[: len(drafted)]
        return accept_sampled(drafted, target, q, generator)
