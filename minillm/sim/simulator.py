"""A discrete-event simulation of the engine under load (chapter 9): the REAL scheduler and block
pool, with a modelled step time instead of the model.

    clock ── arrivals join the queue ──► scheduler.schedule() ──► step time from StepTimeModel ──►
             clock += that time ──► every sampling chunk gets a token ──► scheduler.update() ──►
             requests at their output length finish ──► (again)

With `speculation`, the scheduler reserves room for up to k guesses per decoding request as the
engine's does, placeholders fill it (nothing is computed), and each guess is kept with
probability `acceptance` until the first refusal — so a pass yields 1 to k+1 tokens.

Nothing is computed, so an hour of serving simulates in a second, and every scheduling decision —
admission, chunking, preemption, prefix hits — is exactly the engine's.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

from minillm.config import EngineConfig
from minillm.kv.block_pool import BlockPool
from minillm.metrics import RequestMetrics, percentile
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ContinuousScheduler, SchedulerOutput
from minillm.scheduler.admission import refusal
from minillm.sim.step_time import StepTimeModel
from minillm.stopping import stop_reason


@dataclass(frozen=True)
class SimRequest:
    arrival: float  # seconds
    prompt_len: int
    output_len: int
    shared_prefix_len: int = 0  # leading prompt tokens it shares with every other request that has them

    def __post_init__(self) -> None:
        if not (isinstance(self.arrival, (int, float)) and math.isfinite(self.arrival) and self.arrival >= 0):
            raise ValueError(f"arrival must be a finite number of seconds >= 0, got {self.arrival!r}")
        for name, low in (("prompt_len", 0), ("output_len", 1), ("shared_prefix_len", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.shared_prefix_len > self.prompt_len:
            raise ValueError(f"shared_prefix_len ({self.shared_prefix_len}) is longer than the prompt "
                             f"({self.prompt_len})")


@dataclass(frozen=True)
class SimSpeculation:
    """Speculative decoding, modelled: `k` guesses per decode, each kept with probability `acceptance`
    (independently, until the first refusal: chapter 7's model); proposing them costs `draft_cost`
    of a plain decode step per guess (a draft model ~0.2 on this course's CPU, n-gram lookup ~0)."""

    k: int = 4
    acceptance: float = 0.7
    draft_cost: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance must lie in [0, 1], got {self.acceptance!r}")
        if not self.draft_cost >= 0.0:
            raise ValueError(f"draft_cost must be >= 0, got {self.draft_cost!r}")

    def kept(self, rng: random.Random, guesses: int) -> int:
        """How many of `guesses` the target keeps: the run of acceptances before the first refusal."""
        count = 0
        while count < guesses and rng.random() < self.acceptance:
            count += 1
        return count


@dataclass
class SimResult:
    metrics: list[RequestMetrics]
    steps: list[tuple[float, float, int, int]] = field(default_factory=list)  # (start, seconds, decodes, prompt tokens)
    queue: list[tuple[float, int, int]] = field(default_factory=list)  # (time, waiting, running)
    preemptions: int = 0
    refused: int = 0  # requests the engine would refuse at the door (scheduler/admission.py): never served
    kv_blocks_used: list[int] = field(default_factory=list)  # after each step, beside `queue` (paged KV only)
    num_blocks: int | None = None  # the pool's size (paged KV only)
    prefix_hit_rate: float | None = None  # share of looked-up prompt tokens found cached (None: no prefix cache)

    @property
    def wall(self) -> float:
        return max(m.finish_time for m in self.metrics) if self.metrics else 0.0

    def summary(self) -> dict:
        tokens = sum(m.num_tokens for m in self.metrics)
        ttft = [m.ttft for m in self.metrics if m.ttft is not None]
        tpot = [m.tpot for m in self.metrics if m.tpot is not None]
        return {"requests": len(self.metrics), "output_token_throughput": tokens / self.wall if self.wall else 0.0,
                "request_throughput": len(self.metrics) / self.wall if self.wall else 0.0,
                "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
                "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
                "steps": len(self.steps), "preemptions": self.preemptions, "refused": self.refused}


def simulate(workload: list[SimRequest], config: EngineConfig, step_time: StepTimeModel, max_model_len: int,
             num_blocks: int | None = None, speculation: SimSpeculation | None = None) -> SimResult:
    """Serve `workload` (arrivals in any order) with `config`'s scheduler; times from `step_time`.
    A paged config needs `num_blocks` (the engine sizes it from a byte budget)."""
    if config.batching != "continuous":
        raise ValueError("the simulator runs the continuous scheduler (batching='continuous')")
    pool = None
    if config.kv == "paged":
        if num_blocks is None:
            raise ValueError("kv='paged' needs num_blocks")
        pool = BlockPool(num_blocks, config.block_size, prefix_cache=config.prefix_cache)
    chunk = config.max_tokens_per_prefill_chunk if config.chunked_prefill else None
    scheduler = ContinuousScheduler(config.max_num_seqs, max_model_len, config.max_tokens_per_step, pool, chunk)
    order = sorted(range(len(workload)), key=lambda i: workload[i].arrival)
    requests: dict[str, Request] = {}
    result, clock, next_arrival = SimResult([]), 0.0, 0
    rng = random.Random(speculation.seed if speculation is not None else 0)
    while next_arrival < len(order) or scheduler.has_unfinished():
        while next_arrival < len(order) and workload[order[next_arrival]].arrival <= clock:
            arriving = workload[order[next_arrival]]
            next_arrival += 1
            if refusal(arriving.prompt_len, arriving.output_len, config, max_model_len, pool) is not None:
                result.refused += 1
                continue
            request = Request(str(order[next_arrival - 1]), _prompt(order[next_arrival - 1], arriving),
                              SamplingParams(temperature=0, max_new_tokens=arriving.output_len, ignore_eos=True),
                              arriving.arrival)
            requests[request.request_id] = request
            scheduler.add(request)
        if not scheduler.has_unfinished():
            if next_arrival == len(order):  # the last arrivals were refused
                break
            clock = max(clock, workload[order[next_arrival]].arrival)  # idle until the next arrival
            continue
        _offer_guesses(scheduler, speculation, config, max_model_len)
        output = scheduler.schedule()
        output, drafting = _guess(output, speculation)
        result.preemptions += len(output.preempted_ids)
        if output.is_empty:  # nothing ran and nothing runs: the engine fails the queue's head (never happens
            scheduler.finish(scheduler.waiting[0], "error")  # when the door's checks held)
            result.refused += 1
            continue
        # every token of a chunk beyond a plain decode's one: prompt, chunk, recomputation, or a decode with guesses
        prompt_tokens = sum(c.num_tokens for c in output.chunks if c.num_tokens > 1 or c.is_prefill)
        decodes = sum(1 for c in output.chunks if not c.is_prefill)  # with their guesses, if any
        context = sum(c.start + c.num_tokens for c in output.chunks)
        duration = step_time.predict(len(output.chunks), prompt_tokens, context)
        if drafting:  # the proposer's k passes over the requests that guess, before the target's pass
            duration += speculation.k * speculation.draft_cost * step_time.predict(*drafting)
        result.steps.append((clock, duration, decodes, prompt_tokens))
        clock += duration
        sampled = {c.request_id: [1] * (1 + (speculation.kept(rng, c.num_drafts) if c.num_drafts else 0))
                   for c in output.chunks if c.samples}
        advanced = scheduler.update(output, sampled)
        for request, count in advanced:
            for _ in range(count):
                request.metrics.record_token(clock)
            # at its output length, or where the context is full: the engine's stop rule (no EOS here)
            reason = stop_reason(request.output_token_ids, request.num_prompt_tokens, request.params, (), max_model_len)
            if reason is not None:
                request.metrics.finish_time = clock
                scheduler.finish(request, reason)
        result.queue.append((clock, len(scheduler.waiting), len(scheduler.running)))
        if pool is not None:
            result.kv_blocks_used.append(pool.num_blocks - pool.num_free_blocks)
    if pool is not None:
        result.num_blocks = pool.num_blocks
        result.prefix_hit_rate = pool.cache.hit_rate if pool.cache is not None else None
    served = (requests.get(str(i)) for i in range(len(workload)))  # in the workload's order
    result.metrics = [r.metrics for r in served if r is not None and r.finish_reason == "length"]
    return result


def _offer_guesses(scheduler: ContinuousScheduler, speculation: SimSpeculation | None, config: EngineConfig,
                   max_model_len: int) -> None:
    """Every decoding request may guess as many tokens as the engine would let it (never past its
    output length or the context); the scheduler reserves room for what the budget and blocks allow."""
    if speculation is None:
        return
    k = min(speculation.k, config.max_tokens_per_step - 1)
    for request in scheduler.running:
        decoding = request.num_uncomputed_tokens == 1
        request.max_guesses = request.room_for_guesses(k, max_model_len) if decoding else 0


def _guess(output: SchedulerOutput, speculation: SimSpeculation | None) -> tuple[SchedulerOutput,
                                                                                    tuple[int, int, int] | None]:
    """Placeholder guesses filling the room the scheduler reserved; returns the output with them and
    the draft passes' (sequences, 0, context), or None when nobody guesses."""
    if speculation is None or not any(c.num_lookahead for c in output.chunks):
        return output, None
    chunks = tuple(c.with_guesses([0] * c.num_lookahead) for c in output.chunks)
    guessing = [c for c in chunks if c.num_drafts]
    return (dataclasses.replace(output, chunks=chunks),
            (len(guessing), 0, sum(c.start + c.num_tokens - c.num_drafts for c in guessing)))


def _prompt(index: int, spec: SimRequest) -> list[int]:
    """Token ids: the shared prefix (the same for everyone), then ids of this request's own."""
    shared = min(spec.shared_prefix_len, spec.prompt_len)
    own = [1000 + (index * 7919 + j) % 100_000 for j in range(spec.prompt_len - shared)]
    return [7] * shared + own
