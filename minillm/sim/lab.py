"""The diagnosis lab (chapter 9): servers that miss their latency targets, each for one reason.

An operator on call sees a dashboard, not the configuration: latency percentiles, the queue, how
full the KV cache got, preemptions, prefix-cache hits, how long the steps took. Each lab server is a
workload, an engine configuration that was healthy until ONE setting went wrong, and an SLO; the
dashboard (`dashboard(name)`) shows the workload as its team describes it, the SLO and the
symptoms — never the settings. Which setting went wrong, and so the cause, is the exercise
(exercises/ch09_diagnose.py; the grader knows the answers). Several servers share each cause, with
other workloads and other wrong values, and the grader also diagnoses servers the notebook never
shows: a rule read from the symptoms works, a table of answers does not.

Runs are simulations (`minillm/sim/simulator.py`: the real scheduler, this course's step time), so
they are the same on every machine. The three steps: read the dashboard, find the cause in it,
change ONE setting and look again (`dashboard(name, fix)`) until `meets_slo(name, fix)`.
"""

from __future__ import annotations

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
BLOCK_SIZE = 16  # tokens per KV block, on every lab server (not a setting you can change)
MAX_MODEL_LEN = 2048  # the context, on every lab server

# what a lab dashboard shows, and what each number means (the notebook prints this)
DASHBOARD = {
    "arrival_rate": "requests per second the users send (Poisson arrivals)",
    "prompt_tokens_p50": "a typical prompt's length, in tokens (system prompt included)",
    "prompt_tokens_max": "the longest prompt's length, in tokens",
    "system_prompt_tokens": "leading tokens every prompt shares (the product's system prompt; 0: none)",
    "output_tokens_p50": "a typical answer's length, in tokens",
    "slo_ttft_p99_s": "the target: 99 in 100 requests see their first token within this (seconds)",
    "slo_itl_p99_s": "the target: 99 in 100 gaps between two tokens are within this (seconds)",
    "ttft_p50_s": "time to first token, median over the requests (seconds)",
    "ttft_p99_s": "time to first token, 99th percentile",
    "itl_p50_s": "gap between two tokens of a request, median over all the gaps (seconds)",
    "itl_p99_s": "gap between two tokens, 99th percentile",
    "requests_per_s": "requests finished per second over the run",
    "output_tokens_per_s": "tokens generated per second over the run",
    "running_max": "the most requests running at once (in the batch)",
    "running_mean": "requests running, averaged over time",
    "waiting_max": "the longest the queue got (requests waiting to start)",
    "kv_usage_max": "the largest share of the KV cache's blocks in use at once (0 to 1)",
    "kv_usage_mean": "the share of KV blocks in use, averaged over time",
    "preemptions": "running requests evicted to free KV blocks (their work computed again later)",
    "refused": "requests turned away because they could never fit",
    "prefix_hit_rate": "share of prompt tokens found in the prefix cache, not computed (0 to 1)",
    "step_p50_s": "a typical engine step's duration (seconds)",
    "step_max_s": "the longest engine step (seconds)",
    "prompt_token_share": "share of the tokens the steps computed that were prompt tokens, not decodes",
}


@dataclass(frozen=True)
class Slo:
    """Targets over the whole run: the 99th percentile of every request's TTFT, and of every gap
    between two tokens of any request."""

    ttft_p99_s: float
    itl_p99_s: float  # the gaps between a request's tokens: a stalled step shows here, not in a mean


@dataclass(frozen=True)
class Scenario:
    """A lab server: its workload, its settings (one of them wrong; not shown on its dashboard), its SLO."""

    workload: tuple[SimRequest, ...] = field(repr=False)
    settings: tuple[tuple[str, object], ...] = field(repr=False)  # (setting, value), every one of SETTINGS
    slo: Slo
    rate: float  # requests per second the workload was drawn at
    system_prompt: int  # leading tokens every request shares


class Dashboard(dict):
    """A server's dashboard: the keys of DASHBOARD. It shows what the server did, not how it is set up:
    asking it for a setting is a KeyError that says so."""

    def __missing__(self, key: object):
        if key in SETTINGS:
            raise KeyError(f"{key!r}: a dashboard shows symptoms, not settings — read the cause from what the "
                           "server did")
        raise KeyError(f"{key!r}: a dashboard's keys are {tuple(DASHBOARD)}")

    def get(self, key: object, default: object = None) -> object:
        return self.__missing__(key) if key in SETTINGS else super().get(key, default)

    def copy(self) -> Dashboard:
        return Dashboard(self)


# ----------------------------------------------------------------------------- building servers


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


def build_server(wrong: str, seed: int, slo: Slo) -> Scenario:
    """A server that was healthy until its setting `wrong` (max_num_seqs, num_blocks, chunked_prefill
    or prefix_cache) went wrong; its workload, its healthy settings and the wrong value are drawn
    from `seed`. (How the lab's servers are made, the grader's unseen ones too.)"""
    workload, healthy, broken, rate, system = _draw(wrong, seed)
    return Scenario(workload, tuple((healthy | broken).items()), slo, rate, system)


def _draw(wrong: str, seed: int) -> tuple[tuple[SimRequest, ...], dict, dict, float, int]:
    """(workload, healthy settings, the wrong ones, rate, system prompt length), drawn from `seed`."""
    if wrong not in ("max_num_seqs", "num_blocks", "chunked_prefill", "prefix_cache"):
        raise ValueError(f"wrong must be max_num_seqs, num_blocks, chunked_prefill or prefix_cache, got {wrong!r}")
    rng = random.Random(f"{wrong}/{seed}")
    system = rng.choice((600, 800, 1000, 1200)) if wrong == "prefix_cache" else rng.choice((0, 0, 200, 400, 600))
    own = rng.randint(40, 200)  # a prompt's own tokens, on average
    output = rng.randint(100, 220) if wrong == "chunked_prefill" else rng.randint(40, 200)
    # some requests bring a long document: often, where the lack of chunking is to show; else now and then
    long_every, long_len = (rng.choice((1, 2)), rng.randint(1000, 1600)) if wrong == "chunked_prefill" else (
        (rng.randint(4, 10), rng.randint(600, 1400)) if rng.random() < 0.5 else (0, 0))
    long_len = min(long_len, MAX_MODEL_LEN - system - output * 3 // 2 - BLOCK_SIZE)  # every request fits the context
    # the rate: the healthy server at about half its capacity, for this mix of prompt and output tokens,
    # with ~12 decodes a step (or ~32: a busier server, where a memory or slot limit bites harder); the
    # system prompt counts where the prefix cache is what goes wrong, so that it is a slowdown, not a flood
    batch = rng.choice((12, 12, 32)) if wrong in ("max_num_seqs", "num_blocks") else 12
    prompt_work = (own + (0 if wrong != "prefix_cache" else system)
                   + (long_len / long_every if long_every else 0)) * COURSE_STEP_TIME.per_prompt_token
    decode_work = output * (COURSE_STEP_TIME.base / batch + COURSE_STEP_TIME.per_sequence)
    rate = round(rng.uniform(0.4, 0.6) / (prompt_work + decode_work), 1)
    count = min(240, max(120, int(rate * 40)))
    workload = _poisson(rng, rate, count, own, output, system, long_every, long_len)
    # healthy: enough slots for the requests Little's law puts inside (L = rate x time each stays), and
    # KV blocks for that many of the longest requests; chunked prefill and the prefix cache on
    longest = max(r.prompt_len + r.output_len for r in workload)
    inside = rate * output * (COURSE_STEP_TIME.base + 16 * COURSE_STEP_TIME.per_sequence) * 1.3
    slots = next((s for s in (16, 24, 32, 48, 64, 96, 128) if s >= 2.5 * inside), 128)
    healthy = {"max_num_seqs": slots, "num_blocks": int(slots * _blocks(longest) * rng.uniform(0.9, 1.6)),
               "chunked_prefill": True, "max_tokens_per_prefill_chunk": rng.choice((128, 256)), "prefix_cache": True}
    if wrong == "max_num_seqs":
        broken = {"max_num_seqs": rng.choice((2, 3, 4))}
    elif wrong == "num_blocks":
        broken = {"num_blocks": int(_blocks(longest) * rng.uniform(1.2, 2.5))}
    elif wrong == "chunked_prefill":  # and a chunk size that only matters once chunking is on again
        broken = {"chunked_prefill": False, "max_tokens_per_prefill_chunk": rng.choice((256, 512, 1024))}
    else:
        broken = {"prefix_cache": False}
    return workload, healthy, broken, rate, system


def _poisson(rng: random.Random, rate: float, count: int, own: int, output: int, system: int, long_every: int,
             long_len: int) -> tuple[SimRequest, ...]:
    clock, out = 0.0, []
    for _ in range(count):
        mine = long_len if long_every and rng.random() < 1 / long_every else rng.randint(own // 2, own * 3 // 2)
        out.append(SimRequest(clock, system + mine, rng.randint(output // 2, output * 3 // 2), system))
        clock += rng.expovariate(rate)
    return tuple(out)


# the servers of the notebook: two per cause, in no telling order (their SLOs: what each was meeting
# before the setting went wrong, with room to spare)
SERVERS = {
    "server_a": build_server("num_blocks", 5, Slo(ttft_p99_s=0.4, itl_p99_s=0.05)),
    "server_b": build_server("prefix_cache", 4, Slo(ttft_p99_s=0.5, itl_p99_s=0.06)),
    "server_c": build_server("max_num_seqs", 3, Slo(ttft_p99_s=0.4, itl_p99_s=0.06)),
    "server_d": build_server("chunked_prefill", 5, Slo(ttft_p99_s=0.6, itl_p99_s=0.075)),
    "server_e": build_server("chunked_prefill", 4, Slo(ttft_p99_s=1.1, itl_p99_s=0.075)),
    "server_f": build_server("max_num_seqs", 2, Slo(ttft_p99_s=0.7, itl_p99_s=0.07)),
    "server_g": build_server("prefix_cache", 1, Slo(ttft_p99_s=0.4, itl_p99_s=0.05)),
    "server_h": build_server("num_blocks", 8, Slo(ttft_p99_s=0.5, itl_p99_s=0.05)),
}


# ----------------------------------------------------------------------------- running and reading


def _scenario(server: object) -> Scenario:
    if isinstance(server, Scenario):
        return server
    if not isinstance(server, str) or server not in SERVERS:
        raise ValueError(f"the lab's servers are {tuple(SERVERS)}; got {server!r}")
    return SERVERS[server]


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


def run(server: str | Scenario, fix: dict | None = None) -> SimResult:
    """The server's run, with the settings in `fix` (keys from SETTINGS) changed."""
    scenario, fix = _scenario(server), check_fix(fix)
    settings = dict(scenario.settings) | fix
    num_blocks = settings.pop("num_blocks")
    config = EngineConfig(kv="paged", block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, **settings)
    return simulate(list(scenario.workload), config, COURSE_STEP_TIME, MAX_MODEL_LEN, num_blocks)


_SEEN: dict[tuple, dict] = {}  # (scenario, fix) -> its symptoms: a run takes a second, a dashboard is read often


def dashboard(server: str | Scenario, fix: dict | None = None) -> Dashboard:
    """What the server's dashboard shows over its run (with `fix` applied): the keys of DASHBOARD."""
    scenario, fix = _scenario(server), check_fix(fix)
    key = (scenario, tuple(sorted(fix.items())))
    if key not in _SEEN:
        _SEEN[key] = symptoms(run(scenario, fix))
    prompts = [r.prompt_len for r in scenario.workload]
    return Dashboard({"arrival_rate": scenario.rate, "prompt_tokens_p50": int(percentile(prompts, 50)),
                      "prompt_tokens_max": max(prompts), "system_prompt_tokens": scenario.system_prompt,
                      "output_tokens_p50": int(percentile([r.output_len for r in scenario.workload], 50)),
                      "slo_ttft_p99_s": scenario.slo.ttft_p99_s, "slo_itl_p99_s": scenario.slo.itl_p99_s}
                     | _SEEN[key])


def symptoms(result: SimResult) -> dict:
    """The symptoms of a run, as a dashboard shows them (the run's part of DASHBOARD's keys)."""
    s = result.summary()
    itls = [gap for m in result.metrics for gap in m.itls]
    durations = [d for _, d, _, _ in result.steps]
    wall = sum(durations) or 1.0  # time-weighted means: each step's state held for its duration
    usage = [used / result.num_blocks for used in result.kv_blocks_used] if result.num_blocks else [0.0]
    computed = sum(d + p for *_, d, p in result.steps)
    return {"ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "itl_p50_s": percentile(itls, 50) if itls else 0.0, "itl_p99_s": percentile(itls, 99) if itls else 0.0,
            "requests_per_s": s["request_throughput"], "output_tokens_per_s": s["output_token_throughput"],
            "running_max": max((r for _, _, r in result.queue), default=0),
            "running_mean": sum(r * d for (_, _, r), d in zip(result.queue, durations)) / wall,
            "waiting_max": max((w for _, w, _ in result.queue), default=0),
            "kv_usage_max": max(usage), "kv_usage_mean": sum(u * d for u, d in zip(usage, durations)) / wall,
            "preemptions": s["preemptions"], "refused": s["refused"],
            "prefix_hit_rate": result.prefix_hit_rate or 0.0,
            "step_p50_s": percentile(durations, 50) if durations else 0.0, "step_max_s": max(durations, default=0.0),
            "prompt_token_share": sum(p for *_, p in result.steps) / max(1, computed)}


def meets_slo(server: str | Scenario, fix: dict | None = None) -> bool:
    """Every request served (none refused: a server that turns requests away meets nothing), within
    the server's TTFT and ITL targets, when run with `fix`."""
    seen = dashboard(server, fix)
    return (seen["refused"] == 0 and seen["ttft_p99_s"] <= seen["slo_ttft_p99_s"]
            and seen["itl_p99_s"] <= seen["slo_itl_p99_s"])

