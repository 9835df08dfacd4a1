"""Chapter 3's live experiments, each run interleaved and repeated (`minillm/timing.py`), its words
computed from its numbers and the busy-machine guard beside them:

* `static_vs_continuous` — one workload of mixed lengths under chapter 2's and chapter 3's schedulers;
* `scheduler_cost` — the schedulers driven with no model at all (`replay_schedule`): the steps they
  decide, and the time their own bookkeeping takes per step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from experiments import Finding, same_tokens
from experiments.ch01 import greedy
from minillm import LLM, EngineConfig
from minillm.engine import RequestOutput
from minillm.request import Request
from minillm.scheduler import ContinuousScheduler, StaticScheduler
from minillm.timing import PairedRatio, Trials, interleaved
from minillm.trace import StepRecord

Work = Sequence[tuple[str, int]]  # (prompt, new tokens) per request


def _paired(trials: Trials, num: str, den: str, metric) -> PairedRatio:
    """metric(num) / metric(den) round by round, for description only: unlike `Trials.ratio` the
    guard does not ask its rounds to agree (a ratio near 1 may go either way on any machine)."""
    return PairedRatio(num, den, tuple(a / b for a, b in zip(trials.values(num, metric), trials.values(den, metric))))


# --- static against continuous batching ----------------------------------------------------------

@dataclass
class Run:
    """One run of the workload through one engine: its wall time, its steps, its outputs."""

    seconds: float
    steps: list[StepRecord]
    outputs: list[RequestOutput]
    num_slots: int

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def step_s(self) -> float:
        return self.seconds / self.num_steps

    @property
    def rows_per_step(self) -> float:
        """Every row a forward pass computed, a finished static member's padding row included."""
        return sum(sum(x is not None for x in s.slots) for s in self.steps) / self.num_steps

    @property
    def busy(self) -> float:
        return sum(s.busy_slots for s in self.steps) / (self.num_steps * self.num_slots)

    @property
    def mixed_steps(self) -> int:
        """Steps in which a newcomer's prefill ran beside other requests' decodes."""
        return sum({"prefill", "decode"} <= {x.phase for x in s.slots if x is not None} for s in self.steps)

    @property
    def ttft_p50(self) -> float:
        return statistics.median(o.metrics.ttft for o in self.outputs)


def serve_all(llm: LLM, work: Work) -> Run:
    """Every request of `work` given to `llm` at once; this run's steps from the engine's trace."""
    first = llm.engine.trace.next_step
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in work], [greedy(n) for _, n in work], use_tqdm=False)
    seconds = time.perf_counter() - start
    trace = llm.engine.trace
    return Run(seconds, [s for s in trace.steps if s.step >= first], outs, trace.num_slots)


def static_vs_continuous(work: Work, slots: int = 8, rounds: int = 3) -> Finding:
    """`work` under static and continuous batching with `slots` slots, alternating, `rounds` times
    each. numbers: "static" and "continuous" (each one's fastest `Run`), tokens, and the medians of
    per-round ratios: gain (throughput, continuous over static), fewer_steps, step_ratio (time per
    step, continuous over static), ttft_ratio (median TTFT, static over continuous)."""
    engines = {b: LLM(config=EngineConfig(batching=b, max_num_seqs=slots, max_model_len=256))
               for b in ("static", "continuous")}
    trials = interleaved({b: partial(serve_all, llm, work) for b, llm in engines.items()}, rounds)
    same_tokens(trials, "the schedule")
    return describe_batching(trials, sum(n for _, n in work))


def describe_batching(trials: Trials, tokens: int) -> Finding:
    seconds = lambda run: run.seconds  # noqa: E731
    gain = trials.ratio("static", "continuous", seconds)  # the claim: the guard checks its rounds agree
    step_ratio = _paired(trials, "continuous", "static", lambda run: run.step_s)
    ttft_ratio = _paired(trials, "static", "continuous", lambda run: run.ttft_p50)
    best = {b: min(trials.results[b], key=seconds) for b in ("static", "continuous")}
    fewer_steps = best["static"].num_steps / best["continuous"].num_steps  # the schedule's: the same every run
    holds = gain.value > 1 and gain.agrees
    per_round = gain.rounds()
    if holds:
        text = (f"Continuous batching ran {fewer_steps:.2f}x fewer steps, each {step_ratio.value:.2f}x as long as a "
                f"static one: {gain.value:.2f}x the throughput on the same {tokens} tokens (medians of the per-round "
                f"ratios over {trials.rounds} rounds; the throughput's: {per_round}).")
    else:
        text = (f"Here continuous batching did not give more throughput in every round ({per_round}), though it ran "
                f"{fewer_steps:.2f}x fewer steps for the same {tokens} tokens: other work on the machine decided the "
                "time per step. If no warning follows, rerun this cell.")
    if ttft_ratio.value > 1:
        text += (f" The median TTFT fell too, {ttft_ratio.value:.1f}x: a newcomer takes the first slot that frees up "
                 "instead of waiting for a whole batch to end.")
    else:
        text += (f" The median TTFT did not fall here (static over continuous: {ttft_ratio.value:.2f}x): with these "
                 "requests, the first slots to free up came no sooner than a static batch's end.")
    numbers = {"static": best["static"], "continuous": best["continuous"], "tokens": tokens, "gain": gain.value,
               "fewer_steps": fewer_steps, "step_ratio": step_ratio.value, "ttft_ratio": ttft_ratio.value}
    return Finding(text, holds, numbers, trials)


# --- the schedulers alone ---------------------------------------------------------------------------

def replay_schedule(batching: str, prompt_lens: Sequence[int], output_lens: Sequence[int], num_slots: int,
                    budget: int = 8192) -> tuple[list[list[tuple[str, int, str]]], float]:
    """Drive a real minillm scheduler with no model (every sampled token is a dummy 1). Returns each
    step's chunks as (request, tokens, kind) and the scheduler's own time per step (schedule + update)."""
    scheduler = (StaticScheduler if batching == "static" else ContinuousScheduler)(num_slots, 4096, budget)
    for i, (p, o) in enumerate(zip(prompt_lens, output_lens)):
        scheduler.add(Request(str(i), [1] * p, greedy(o), arrival_time=0.0))
    steps, spent = [], 0.0
    while scheduler.has_unfinished():
        start = time.perf_counter()
        out = scheduler.schedule()
        advanced = scheduler.update(out, {c.request_id: [1] for c in out.chunks if c.samples})
        spent += time.perf_counter() - start
        for request, _ in advanced:  # the engine's stop rule here: the length limit
            if request.num_output_tokens == request.params.max_new_tokens:
                scheduler.finish(request, "length")
        steps.append([(c.request_id, c.num_tokens, "pad" if c.is_padding else "prefill" if c.is_prefill else "decode")
                      for c in out.chunks])
    return steps, spent / len(steps)


def scheduler_cost(prompt_lens: Sequence[int], output_lens: Sequence[int], num_slots: int, rounds: int = 5,
                   step_s: float | None = None, step_name: str = "a model step") -> Finding:
    """Both schedulers replayed on the same requests, alternating, `rounds` times each. With
    `step_s` (a model step's time, called `step_name` in the words), the claim is that their
    bookkeeping differs by under 5% of it.
    numbers: replays (each scheduler's steps), cost (each one's fastest time per step, seconds),
    ratio (continuous over static, the median of per-round ratios), share (the difference over
    `step_s`, or None)."""
    trials = interleaved({b: partial(replay_schedule, b, prompt_lens, output_lens, num_slots)
                          for b in ("static", "continuous")}, rounds)
    return describe_cost(trials, step_s, step_name)


def describe_cost(trials: Trials, step_s: float | None, step_name: str = "a model step") -> Finding:
    per_step = lambda run: run[1]  # noqa: E731
    cost = {b: trials.best(b, per_step) for b in ("static", "continuous")}
    ratio = _paired(trials, "continuous", "static", per_step)
    replays = {b: trials.results[b][0][0] for b in ("static", "continuous")}
    text = (f"The scheduler's own work took {cost['static'] * 1e6:.0f} µs a step for static batching and "
            f"{cost['continuous'] * 1e6:.0f} µs for continuous (each the fastest of {trials.rounds} runs, the two "
            f"alternating; round by round continuous took {ratio.value:.2f}x static's time, the median).")
    share, holds = None, True
    if step_s is not None:
        share = abs(cost["continuous"] - cost["static"]) / step_s
        holds = share < 0.05
        text += (f" The difference is {share:.1%} of {step_name} ({step_s * 1e3:.1f} ms)"
                 + (": too small to matter to a step's time." if holds else
                    ": large enough to show in the time per step."))
    return Finding(text, holds, {"replays": replays, "cost": cost, "ratio": ratio.value, "share": share}, trials)
