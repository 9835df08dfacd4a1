"""The model runner: turns a SchedulerOutput into one forward pass and samples the next tokens.

It makes no scheduling decisions. It keeps only what sampling needs per request (the request, for
its settings and the tokens penalties count, and its seeded generator), set up when the request is
admitted and dropped when it finishes. The whole batch is sampled at once (`minillm/sampler.py`);
each row draws with its own request's generator, so a row that raises fails its own request, and its
neighbours' tokens (and seeded generators) are exactly what they would have been without it.

    chunks:     A: prefill 5 tokens     B: decode 1     C: decode 1
    input_ids:  [a0 a1 a2 a3 a4 | b7 | c3]                 one flat batch
    positions:  [ 0  1  2  3  4 |  7 |  3]
    logits of:               ^     ^    ^                  the last row of each sampling chunk
                 ^  ^  ^  ^                                + every prompt row, for a request that
                                                             asked for its prompt's logprobs

Before the pass it copies the K/V blocks the scheduler asked for (copy-on-write of a block shared by
the n samples of one prompt, or a fork's prompt on a contiguous cache).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minillm.attention import ContiguousKVCache
from minillm.attention.chunks import batch_for
from minillm.attention.paged import PagedKVCache
from minillm.graphs.recorded_decode import RecordedDecode
from minillm.logprobs import TokenLogprob, token_logprobs
from minillm.model.decoder import CausalLM
from minillm.request import Request
from minillm.sampler import SamplingRow, StepSampler
from minillm.sampling import SamplingParams
from minillm.scheduler.output import ScheduledChunk, SchedulerOutput
from minillm.speculative.acceptance import accept_greedy, accept_sampled
from minillm.speculative.proposers import Proposal
from minillm.structured.step_masks import StepMasks

if TYPE_CHECKING:
    from minillm.distributed.executor import TensorParallelWorkers


def forward_logits(model: CausalLM, cache: ContiguousKVCache | PagedKVCache, chunks: tuple[ScheduledChunk, ...],
                   rows: list[int]) -> torch.Tensor | None:
    """One forward pass over `chunks` and the LM head on the hidden `rows`: (len(rows), vocab) logits (None on a
    tensor-parallel worker, whose share went to rank 0)."""
    input_ids = torch.tensor([t for c in chunks for t in c.token_ids], device=model.device)  # (num_tokens,)
    backend = batch_for(cache, chunks)
    hidden = model(input_ids, backend.positions, backend)  # (num_tokens, hidden)
    return model.logits(hidden[rows])


def _logit_rows(chunks: tuple[ScheduledChunk, ...], prompt_rows: list[_PromptRow]) -> list[int]:
    """The hidden rows whose logits a step needs: the prompt rows asked for, then each sampling chunk's last
    row (and the rows of its guesses)."""
    ends = list(itertools.accumulate(c.num_tokens for c in chunks))
    return [r.hidden_row for r in prompt_rows] + [r for c, end in zip(chunks, ends) if c.samples
                                                  for r in range(end - 1 - c.num_drafts, end)]


@dataclass
class StepResult:
    sampled: dict[str, list[int]] = field(default_factory=dict)  # request id -> its new token(s): one, or with
    #                                                               speculation the kept guesses and one more
    failed: dict[str, Exception] = field(default_factory=dict)  # request id -> why it got none
    bucket: int | None = None  # the recorded step's batch size, when the step ran one (chapter 8)
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)  # request id -> one per sampled token
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)  # request id -> the logprobs of
    #                                                               the prompt tokens this step computed, in order


@dataclass(frozen=True)
class _PromptRow:
    """A prompt token whose logprob this step computes, from the hidden row of the token before it."""

    request_id: str
    hidden_row: int
    token_id: int
    num_top: int


class ModelRunner:
    def __init__(self, model: CausalLM, cache: ContiguousKVCache | PagedKVCache,
                 recorded: RecordedDecode | None = None, workers: TensorParallelWorkers | None = None):
        self.model, self.cache = model, cache
        self.recorded = recorded  # pure-decode steps through a CUDA Graph or a compiled step (chapter 8)
        self.workers = workers  # tensor parallelism (chapter 13): the other ranks, told each step before it runs
        self.sampling: dict[str, tuple[SamplingParams, torch.Generator | None]] = {}
        self.requests: dict[str, Request] = {}  # what the processors read: prompt and output tokens
        self.prompt_tokens: dict[str, torch.Tensor] = {}  # a repetition penalty's prompt ids, distinct, made once

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, proposals: Mapping[str, Proposal] | None = None) -> StepResult:
        """Run one step: new tokens for each chunk that samples (or the error its sampling raised).
        A chunk with guesses (speculative decoding) is verified here against its `proposals` entry.
        An error of the forward pass itself propagates: it belongs to the whole batch."""
        for request_id in output.finished_ids:  # first: a finished request's id may be reused by a new one
            self.sampling.pop(request_id, None)
            self.requests.pop(request_id, None)
            self.prompt_tokens.pop(request_id, None)
        for admitted in output.new_requests:  # a preempted request comes back with its generator as it was
            for request in admitted.samples:  # the samples still to fork draw their first token with it
                if request.request_id not in self.sampling:
                    self.sampling[request.request_id] = (request.params, request.params.make_generator(
                        self.model.device))
                    self.requests[request.request_id] = request
                    if request.params.repetition_penalty != 1.0:  # read every step: one tensor, not a list
                        self.prompt_tokens[request.request_id] = torch.tensor(sorted(set(request.prompt_token_ids)))
        chunks = output.chunks
        prompt_rows = self._prompt_rows(chunks)
        if self.workers is not None and (chunks or output.has_copies):  # the same step on every rank
            self.workers.run_step(output.block_copies, output.slot_copies, chunks, _logit_rows(chunks, prompt_rows))
        if output.block_copies:
            self.cache.copy_blocks(list(output.block_copies))
        if output.slot_copies:
            self.cache.copy_slots(list(output.slot_copies))
        if output.is_empty:
            if self.workers is not None:  # a step of copies only: its span ends here
                self.workers.step_finished()
            return StepResult()
        recorded = None
        if not prompt_rows and self.recorded is not None and self.recorded.accepts(chunks):
            recorded = self.recorded.run(chunks)
        if recorded is not None:  # one row per chunk; keep the sampling ones
            all_logits, bucket = recorded
            logits = all_logits[[i for i, c in enumerate(chunks) if c.samples]]  # (num_rows, vocab)
            prompt_logits = None
        else:
            (logits, prompt_logits), bucket = self._eager_logits(chunks, prompt_rows), None
        if self.workers is not None:
            self.workers.step_finished()  # rank 0's forward pass ends here; sampling is its own
        result = StepResult(bucket=bucket)
        if prompt_rows:
            tokens, tops = [r.token_id for r in prompt_rows], [r.num_top for r in prompt_rows]
            computed = token_logprobs(prompt_logits, tokens, tops)
            for row, entry in zip(prompt_rows, computed):
                result.prompt_logprobs.setdefault(row.request_id, []).append(entry)
        sampling = [c for c in chunks if c.samples]
        if sampling:
            self._sample(sampling, logits, proposals, result)
        return result

    def _prompt_rows(self, chunks: tuple[ScheduledChunk, ...]) -> list[_PromptRow]:
        """The prompt tokens whose logprobs this step can give: token j comes from the hidden row of
        position j - 1, so a chunk over positions [start, end) gives tokens start + 1 .. end (those
        inside the prompt and not given before — a recomputed prompt gives nothing new)."""
        rows, offset = [], 0
        for chunk in chunks:
            request = self.requests.get(chunk.request_id)
            if request is not None and not chunk.is_padding and request.wants_prompt_logits:
                first = max(chunk.start + 1, len(request.prompt_logprobs))
                for j in range(first, min(chunk.start + chunk.num_tokens + 1, request.num_prompt_tokens)):
                    rows.append(_PromptRow(chunk.request_id, offset + j - 1 - chunk.start, request.prompt_token_ids[j],
                                           request.params.prompt_logprobs))
            offset += chunk.num_tokens
        return rows

    def _eager_logits(self, chunks, prompt_rows: list[_PromptRow]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward pass of any step (prefill, decode, chunks, guesses): logits of the rows that
        sample, (num_rows, vocab) — each sampling chunk's last real token, and its guesses — and of
        the prompt rows asked for, (len(prompt_rows), vocab)."""
        logits = forward_logits(self.model, self.cache, chunks, _logit_rows(chunks, prompt_rows))
        return logits[len(prompt_rows) :], logits[: len(prompt_rows)] if prompt_rows else None

    def _sample(self, chunks: list[ScheduledChunk], logits: torch.Tensor, proposals: Mapping[str, Proposal] | None,
                result: StepResult) -> None:
        """Every sampling chunk's token(s), from one batched sampler. Row i of `logits` is chunk i's
        last row (or its k + 1 rows with guesses); the samples forking from a chunk sample its last
        row again, each with its own generator."""
        rows: list[SamplingRow] = []
        logit_rows: list[int] = []  # the row of `logits` each sampling row reads
        owners: list[tuple[ScheduledChunk, int, list[str]]] = []  # chunk, its first sampling row, its samples
        first = 0
        for chunk in chunks:
            request, (params, generator) = self.requests[chunk.request_id], self.sampling[chunk.request_id]
            drafts = list(chunk.draft_token_ids)
            start = len(rows)
            for j in range(chunk.num_drafts + 1):  # row j follows the first j guesses
                history = request.output_token_ids + drafts[:j] if j else request.output_token_ids
                rows.append(SamplingRow(params, self.prompt_tokens.get(chunk.request_id, request.prompt_token_ids),
                                        history, generator))
                logit_rows.append(first + j)
            for child_id in chunk.forks:
                child, (child_params, child_generator) = self.requests[child_id], self.sampling[child_id]
                rows.append(SamplingRow(child_params, self.prompt_tokens.get(child_id, child.prompt_token_ids),
                                        child.output_token_ids, child_generator))
                logit_rows.append(first + chunk.num_drafts)
            owners.append((chunk, start, [chunk.request_id, *chunk.forks]))
            first += chunk.num_drafts + 1
        if logit_rows != list(range(len(logits))):
            logits = logits[logit_rows]  # (len(rows), vocab): a forking chunk's row repeated
        sampler = StepSampler(logits, rows, self.model.config.eos_token_ids, self._masks(owners, len(rows),
                                                                                         logits.shape[-1]))
        single = [start + i for chunk, start, ids in owners if not chunk.num_drafts for i in range(len(ids))]
        tokens, failed_rows = sampler.tokens(single)
        logprob_rows: list[tuple[str, int, int]] = []  # (sample id, sampling row, token) whose logprob is asked
        for chunk, start, ids in owners:
            try:
                if chunk.num_drafts:
                    new = {chunk.request_id: self._verify(chunk, sampler, start, proposals)}
                else:
                    failed = [failed_rows[start + i] for i in range(len(ids)) if start + i in failed_rows]
                    if failed:  # a sample's draw failed: the request (and its other samples) with it
                        raise failed[0]
                    new = {sample_id: [tokens[start + i]] for i, sample_id in enumerate(ids)}
            except Exception as err:
                result.failed[chunk.request_id] = err
                continue
            result.sampled.update(new)
            for i, (sample_id, sample_tokens) in enumerate(new.items()):
                if self.sampling[sample_id][0].logprobs is not None:
                    first_row = start + i if not chunk.num_drafts else start
                    logprob_rows += [(sample_id, first_row + j, t) for j, t in enumerate(sample_tokens)]
        if logprob_rows:  # from the raw logits: the model's own distribution
            computed = token_logprobs(logits[[row for _, row, _ in logprob_rows]], [t for _, _, t in logprob_rows],
                                      [self.sampling[sid][0].logprobs for sid, _, _ in logprob_rows])
            for (sample_id, _, _), entry in zip(logprob_rows, computed):
                result.logprobs.setdefault(sample_id, []).append(entry)

    def _masks(self, owners: list[tuple[ScheduledChunk, int, list[str]]], num_rows: int,
               vocab_size: int) -> StepMasks | None:
        """Structured outputs (chapter 11): the step's bitmask, a row per sampling row of a request with a
        grammar — after each guess prefix for a verifying chunk. None when no row has a grammar."""
        masks = None
        for chunk, start, ids in owners:
            for i, sample_id in enumerate(ids):
                matcher = self.requests[sample_id].matcher
                if matcher is None:
                    continue
                masks = masks or StepMasks(num_rows, vocab_size)
                if i == 0:
                    masks.fill(start, matcher, chunk.draft_token_ids)
                else:  # a sample forking from the chunk: its own first token, from its own matcher
                    masks.fill(start + chunk.num_drafts + i, matcher)
        return masks

    def _verify(self, chunk: ScheduledChunk, sampler: StepSampler, start: int,
                proposals: Mapping[str, Proposal] | None) -> list[int]:
        """The tokens kept from a chunk's guesses, and one more: the acceptance rule over its k + 1 rows."""
        drafted = chunk.draft_token_ids
        params, generator = self.sampling[chunk.request_id]
        n = chunk.num_drafts + 1
        for row in range(start, start + n):
            if row in sampler.failed_rows:
                raise sampler.failed_rows[row]
        if params.greedy:
            return accept_greedy(drafted, sampler.argmax[start : start + n])
        proposal = proposals.get(chunk.request_id) if proposals is not None else None
        q = None  # the guesses were drawn from q; the scheduler may have kept only the first few of them
        if proposal is not None and proposal.probs is not None and proposal.token_ids[: len(drafted)] == list(drafted):
            q = proposal.probs[: len(drafted)]
        return accept_sampled(drafted, sampler.probs(start, n), q, generator)
