"""The diagnosis lab (chapter 9): servers that miss their latency targets, each for one reason.

Each scenario is a workload, an engine configuration with one thing wrong, and an SLO. Its run is a
simulation (`minillm/sim/simulator.py`: the real scheduler, this course's step time), so it is the
same on every machine. The three steps: read the symptoms (`symptoms`), find the cause in them, change
ONE setting and run again (`run(name, fix)`) until the SLO holds.

    scenario        what the learner sees first
    queueing        TTFT in seconds, steps never full of work... or are they?
    preemption      tokens per second low, preemptions by the hundred
    long_prompts    a good median TPOT, a terrible p99
    shared_prompt   TTFT high although nothing queues: every request computes the same long prefix
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from minillm.config import EngineConfig
from minillm.metrics import percentile
from minillm.sim.simulator import SimRequest, SimResult, simulate
from minillm.sim.step_time import StepTimeModel

# this course's CPU serving the shipped target (benchmarks/serve_load.py fitted it): fixed, so that the
# lab grades the same everywhere
COURSE_STEP_TIME = StepTimeModel(base=0.0109, per_sequence=0.00022, per_prompt_token=0.000138,
                                 per_context_token=7.5e-7)
CAUSES = ("too few batch slots", "KV cache too small", "long prompts stall the decodes",
          "a shared prefix is computed again for every request")
SETTINGS = ("max_num_seqs", "num_blocks", "chunked_prefill", "max_tokens_per_prefill_chunk", "prefix_cache")


@dataclass(frozen=True)
class Slo:
    ttft_p99_s: float
    itl_p99_s: float  # the gaps between a request's tokens: a stalled step shows here, not in a mean


@dataclass(frozen=True)
class Scenario:
    description: str
    config: EngineConfig
    num_blocks: int
    workload: tuple[SimRequest, ...]
    slo: Slo
    cause: str  # one of CAUSES


def _poisson(rate: float, count: int, prompt: tuple[int, int], output: tuple[int, int], seed: int,
             shared: int = 0, long_every: int = 0, long_len: int = 0) -> tuple[SimRequest, ...]:
    rng, clock, out = random.Random(seed), 0.0, []
    for i in range(count):
        length = long_len if long_every and i % long_every == long_every - 1 else rng.randint(*prompt)
        out.append(SimRequest(clock, length, rng.randint(*output), min(shared, length - 1)))
        clock += rng.expovariate(rate)
    return tuple(out)


def _paged(**overrides) -> EngineConfig:
    return EngineConfig(**({"kv": "paged", "block_size": 16, "max_num_seqs": 16, "max_model_len": 2048} | overrides))


SCENARIOS = {
    "queueing": Scenario("Requests of ~100 prompt and ~64 output tokens arrive at 10 per second.",
                         _paged(max_num_seqs=2), 4096, _poisson(10, 300, (60, 140), (40, 90), seed=1),
                         Slo(ttft_p99_s=1.0, itl_p99_s=0.1), CAUSES[0]),
    "preemption": Scenario("Requests of ~300 prompt and ~300 output tokens arrive at 1.5 per second.",
                           _paged(), 60, _poisson(1.5, 150, (200, 400), (200, 400), seed=2),
                           Slo(ttft_p99_s=1.0, itl_p99_s=0.1), CAUSES[1]),
    "long_prompts": Scenario("Chat-sized requests at 4 per second; every 4th brings a 1,500-token document.",
                             _paged(max_tokens_per_step=4096), 4096,
                             _poisson(4, 200, (30, 80), (60, 120), seed=3, long_every=4, long_len=1500),
                             Slo(ttft_p99_s=2.0, itl_p99_s=0.1), CAUSES[2]),
    "shared_prompt": Scenario("Every request starts with the same 1,200-token system prompt; 4 per second.",
                              _paged(max_tokens_per_step=4096), 4096,
                              _poisson(4, 150, (1230, 1300), (20, 40), seed=4, shared=1200),
                              Slo(ttft_p99_s=0.3, itl_p99_s=0.2), CAUSES[3]),
}


def run(name: str, fix: dict | None = None) -> SimResult:
    """The scenario's run, with the settings in `fix` (keys from SETTINGS) changed."""
    scenario = SCENARIOS[name]
    fix = dict(fix or {})
    unknown = set(fix) - set(SETTINGS)
    if unknown:
        raise ValueError(f"settings you can change: {SETTINGS}; got {sorted(unknown)}")
    num_blocks = int(fix.pop("num_blocks", scenario.num_blocks))
    config = dataclasses.replace(scenario.config, **fix)
    return simulate(list(scenario.workload), config, COURSE_STEP_TIME, config.max_model_len, num_blocks)


def symptoms(result: SimResult) -> dict:
    """What a dashboard would show: latency percentiles, throughput, the queue, preemptions, and how
    the steps' time was spent."""
    s = result.summary()
    itls = [gap for m in result.metrics for gap in m.itls]
    longest_step = max((duration for _, duration, _, _ in result.steps), default=0.0)
    prompt_share = sum(p for *_, p in result.steps) / max(1, sum(d + p for *_, d, p in result.steps))
    return {"ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"], "tpot_p50_s": s["tpot_p50_s"],
            "tpot_p99_s": s["tpot_p99_s"], "itl_p50_s": percentile(itls, 50), "itl_p99_s": percentile(itls, 99),
            "output_tokens_per_s": s["output_token_throughput"],
            "max_waiting": max((w for _, w, _ in result.queue), default=0),
            "max_running": max((r for _, _, r in result.queue), default=0),
            "preemptions": s["preemptions"], "longest_step_s": longest_step, "prompt_token_share": prompt_share,
            "ttft_p90_s": percentile([m.ttft for m in result.metrics if m.ttft is not None], 90)}


def meets_slo(name: str, result: SimResult) -> bool:
    s, slo = symptoms(result), SCENARIOS[name].slo
    return s["ttft_p99_s"] <= slo.ttft_p99_s and s["itl_p99_s"] <= slo.itl_p99_s
