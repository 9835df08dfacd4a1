"""The diagnosis lab (chapter 9): four servers that miss their latency targets, each for one reason
(which one is the exercise: exercises/ch09_diagnose.py; the grader knows the answers).

Each scenario is a workload, an engine configuration with one thing wrong, and an SLO. Its run is a
simulation (`minillm/sim/simulator.py`: the real scheduler, this course's step time), so it is the
same on every machine. The three steps: read the symptoms (`symptoms`), find the cause in them, change
ONE setting and run again (`run(name, fix)`) until the SLO holds (`meets_slo`).
"""

from __future__ import annotations

import dataclasses
import numbers
import random
from dataclasses import dataclass, field

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
# the settings a fix may change, and what each may be set to: (type, lowest, highest) — generous,
# but a run stays seconds long
SETTING_RANGES = {"max_num_seqs": (int, 1, 1024), "num_blocks": (int, 16, 65_536),
                  "chunked_prefill": (bool, False, True), "max_tokens_per_prefill_chunk": (int, 16, 8192),
                  "prefix_cache": (bool, False, True)}
SETTINGS = tuple(SETTING_RANGES)


@dataclass(frozen=True)
class Slo:
    """Targets over the whole run: the 99th percentile of every request's TTFT, and of every gap
    between two tokens of any request."""

    ttft_p99_s: float
    itl_p99_s: float  # the gaps between a request's tokens: a stalled step shows here, not in a mean


@dataclass(frozen=True)
class Scenario:
    description: str
    config: EngineConfig = field(repr=False)
    num_blocks: int
    workload: tuple[SimRequest, ...] = field(repr=False)
    slo: Slo


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
    "server_a": Scenario("~300 prompt, ~300 output tokens each; 1.5 requests/s",
                         _paged(), 60, _poisson(1.5, 150, (200, 400), (200, 400), seed=2),
                         Slo(ttft_p99_s=1.0, itl_p99_s=0.1)),
    "server_b": Scenario("each starts with the same 1,200-token system prompt; 4 requests/s",
                         _paged(max_tokens_per_step=4096), 4096,
                         _poisson(4, 150, (1230, 1300), (20, 40), seed=4, shared=1200),
                         Slo(ttft_p99_s=0.3, itl_p99_s=0.2)),
    "server_c": Scenario("~100 prompt, ~64 output tokens each; 10 requests/s",
                         _paged(max_num_seqs=2), 4096, _poisson(10, 300, (60, 140), (40, 90), seed=1),
                         Slo(ttft_p99_s=1.0, itl_p99_s=0.1)),
    "server_d": Scenario("chat-sized, 4 requests/s; every 4th brings a 1,500-token document",
                         _paged(max_tokens_per_step=4096), 4096,
                         _poisson(4, 200, (30, 80), (60, 120), seed=3, long_every=4, long_len=1500),
                         Slo(ttft_p99_s=2.0, itl_p99_s=0.1)),
}


def _scenario(name: object) -> Scenario:
    if not isinstance(name, str) or name not in SCENARIOS:
        raise ValueError(f"the lab's scenarios are {tuple(SCENARIOS)}; got {name!r}")
    return SCENARIOS[name]


def settings(name: str) -> dict:
    """The scenario's current value of every setting you can change."""
    scenario = _scenario(name)
    return {key: scenario.num_blocks if key == "num_blocks" else getattr(scenario.config, key) for key in SETTINGS}


def check_fix(fix: object) -> dict:
    """`fix` as a dict of settings, each of SETTINGS and of its type and range; a clear error if not."""
    if fix is None:
        return {}
    if not isinstance(fix, dict):
        raise TypeError(f"a fix is a dict {{setting: value}} with settings from {SETTINGS}; got {fix!r}")
    unknown = [key for key in fix if key not in SETTINGS]
    if unknown:
        raise ValueError(f"settings you can change: {SETTINGS}; got {unknown}")
    for key, value in fix.items():
        kind, low, high = SETTING_RANGES[key]
        if kind is bool and not isinstance(value, bool):
            raise TypeError(f"{key} must be True or False, not {value!r}")
        if kind is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TypeError(f"{key} must be an integer, not {value!r}")
        if kind is int and not low <= value <= high:
            raise ValueError(f"{key} must lie in [{low}, {high}] in this lab, not {value}")
    return {key: int(value) if SETTING_RANGES[key][0] is int else value for key, value in fix.items()}


def run(name: str, fix: dict | None = None) -> SimResult:
    """The scenario's run, with the settings in `fix` (keys from SETTINGS) changed."""
    scenario, fix = _scenario(name), check_fix(fix)
    num_blocks = fix.pop("num_blocks", scenario.num_blocks)
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
            "preemptions": s["preemptions"], "refused": s["refused"], "longest_step_s": longest_step,
            "prompt_token_share": prompt_share,
            "ttft_p90_s": percentile([m.ttft for m in result.metrics if m.ttft is not None], 90)}


def meets_slo(name: str, result: SimResult) -> bool:
    """Every request served (none refused: a server that turns requests away meets nothing), within
    the scenario's TTFT and ITL targets."""
    s, slo = symptoms(result), _scenario(name).slo
    return s["refused"] == 0 and s["ttft_p99_s"] <= slo.ttft_p99_s and s["itl_p99_s"] <= slo.itl_p99_s
