"""A discrete-event simulation of the engine under load (chapter 9): the REAL scheduler and block
pool, with a modelled step time instead of the model.

    clock ── arrivals join the queue ──► scheduler.schedule() ──► step time from StepTimeModel ──►
             clock += that time ──► every sampling chunk gets a token ──► scheduler.update() ──►
             requests at their output length finish ──► (again)

Nothing is computed, so an hour of serving simulates in a second, and every scheduling decision —
admission, chunking, preemption, prefix hits — is exactly the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.config import EngineConfig
from minillm.kv.block_pool import BlockPool
from minillm.metrics import RequestMetrics, percentile
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ContinuousScheduler
from minillm.sim.step_time import StepTimeModel


@dataclass(frozen=True)
class SimRequest:
    arrival: float  # seconds
    prompt_len: int
    output_len: int
    shared_prefix_len: int = 0  # leading prompt tokens it shares with every other request that has them


@dataclass
class SimResult:
    metrics: list[RequestMetrics]
    steps: list[tuple[float, float, int, int]] = field(default_factory=list)  # (start, seconds, decodes, prompt tokens)
    queue: list[tuple[float, int, int]] = field(default_factory=list)  # (time, waiting, running)
    preemptions: int = 0

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
                "steps": len(self.steps), "preemptions": self.preemptions}


def simulate(workload: list[SimRequest], config: EngineConfig, step_time: StepTimeModel, max_model_len: int,
             num_blocks: int | None = None) -> SimResult:
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
    requests: dict[str, tuple[Request, int]] = {}
    result, clock, next_arrival = SimResult([]), 0.0, 0
    while next_arrival < len(order) or scheduler.has_unfinished():
        while next_arrival < len(order) and workload[order[next_arrival]].arrival <= clock:
            spec = workload[order[next_arrival]]
            request = Request(str(order[next_arrival]), _prompt(order[next_arrival], spec),
                              SamplingParams(temperature=0, max_new_tokens=spec.output_len, ignore_eos=True),
                              spec.arrival)
            requests[request.request_id] = (request, spec.output_len)
            scheduler.add(request)
            next_arrival += 1
        if not scheduler.has_unfinished():
            clock = workload[order[next_arrival]].arrival  # idle until the next arrival
            continue
        output = scheduler.schedule()
        result.preemptions += len(output.preempted_ids)
        if output.is_empty:  # nothing can run (the queue's head can never fit): the engine would refuse it
            head = scheduler.waiting[0]
            scheduler.finish(head, "error")
            continue
        prompt_tokens = sum(c.num_tokens for c in output.chunks if c.num_tokens > 1 or c.is_prefill)
        decodes = len(output.chunks) - sum(1 for c in output.chunks if c.num_tokens > 1 or c.is_prefill)
        context = sum(c.start + c.num_tokens for c in output.chunks)
        duration = step_time.predict(len(output.chunks), prompt_tokens, context)
        result.steps.append((clock, duration, decodes, prompt_tokens))
        clock += duration
        advanced = scheduler.update(output, {c.request_id: [1] for c in output.chunks if c.samples})
        for request, _ in advanced:
            request.metrics.record_token(clock)
            if request.num_output_tokens >= requests[request.request_id][1]:
                request.metrics.finish_time = clock
                scheduler.finish(request, "length")
        result.queue.append((clock, len(scheduler.waiting), len(scheduler.running)))
    result.metrics = [requests[str(i)][0].metrics for i in range(len(workload)) if str(i) in requests
                      and requests[str(i)][0].finish_reason == "length"]
    return result


def _prompt(index: int, spec: SimRequest) -> list[int]:
    """Token ids: the shared prefix (the same for everyone), then ids of this request's own."""
    shared = min(spec.shared_prefix_len, spec.prompt_len)
    own = [1000 + (index * 7919 + j) % 100_000 for j in range(spec.prompt_len - shared)]
    return [7] * shared + own
