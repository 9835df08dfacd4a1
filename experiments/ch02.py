"""Chapter 2's live experiments, each run interleaved and repeated (`minillm/timing.py`), its words
computed from its numbers and the busy-machine guard beside them:

* `decode_step_by_batch` — the time of one decode step for batches of 1 to 32 identical requests;
* `serial_vs_static` — the same requests one at a time (chapter 1's cached loop) and in static batches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from experiments import Finding, same_tokens
from experiments.ch01 import greedy, times
from minillm import LLM, EngineConfig
from minillm.generate import generate_with_cache
from minillm.timing import PairedRatio, Trials, interleaved

Work = Sequence[tuple[str, int]]  # (prompt, new tokens) per request


# --- one decode step, for growing batches -----------------------------------------------------------

@dataclass(frozen=True)
class DecodeSteps:
    """One run of `batch` identical requests: the median time of its decode steps."""

    batch: int
    step_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_s


def decode_steps(llm: LLM, batch: int, new_tokens: int = 24) -> DecodeSteps:
    """`batch` identical requests through a static-batching engine; the engine's trace times every
    step, and the first one is their prefill."""
    llm.generate(["ROMEO:"] * batch, greedy(new_tokens), use_tqdm=False)
    decode = llm.engine.trace.steps[-(new_tokens - 1):]
    assert all(s.num_tokens == batch for s in decode)  # one token per request, every step
    return DecodeSteps(batch, statistics.median(s.duration for s in decode))


def decode_step_by_batch(llm: LLM, batches: Sequence[int] = (1, 2, 4, 8, 16, 32), new_tokens: int = 24,
                         rounds: int = 3, rerun: str = "this cell") -> Finding:
    """Every batch size once per round, the order rotated round by round. numbers: step_s (batch ->
    its fastest median decode step, seconds), slowdown (the largest batch's step over batch 1's) and
    gain (its tokens per second over batch 1's), each the median of per-round ratios."""
    trials = interleaved({f"batch {b}": partial(decode_steps, llm, b, new_tokens) for b in batches}, rounds,
                         rerun=rerun)
    return describe_batches(trials, batches)


def describe_batches(trials: Trials, batches: Sequence[int]) -> Finding:
    step = lambda run: run.step_s  # noqa: E731
    step_s = {b: trials.best(f"batch {b}", step) for b in batches}
    one, big = min(batches), max(batches)
    gain = trials.ratio(f"batch {big}", f"batch {one}", lambda run: run.tokens_per_s)  # the claim: checked
    slowdown = PairedRatio(f"batch {big}", f"batch {one}",  # descriptive: it may sit near 1 on a GPU
                           tuple(a / b for a, b in zip(trials.values(f"batch {big}", step),
                                                       trials.values(f"batch {one}", step))))
    change = f"{slowdown.value:.1f}x slower" if slowdown.value >= 1 else f"{1 / slowdown.value:.1f}x faster"
    holds = gain.value > 1 and gain.agrees
    if holds:
        text = (f"From batch {one} to {big}, a decode step became {change} ({step_s[one] * 1e3:.1f} → "
                f"{step_s[big] * 1e3:.1f} ms, each the fastest of {trials.rounds} runs) while producing "
                f"{big // one}x the tokens: throughput went up {times(gain.value)} (the median of the per-round "
                f"ratios {gain.rounds(times)}).")
    else:
        text = (f"Here batch {big} did not give more tokens per second than batch {one} in every round (ratios "
                f"{gain.rounds('{:.2f}')}), though each of its steps serves {big // one}x "
                "the requests: other work on the machine decided these numbers. If no warning follows, rerun "
                "this cell.")
    numbers = {"step_s": step_s, "slowdown": slowdown.value, "gain": gain.value}
    return Finding(text, holds, numbers, trials)


# --- one at a time against static batches ---------------------------------------------------------

@dataclass(frozen=True)
class Served:
    """One run of the whole workload: its wall time, every request's tokens, and (for an engine)
    the share of its slot-steps that did work."""

    seconds: float
    token_ids: tuple[tuple[int, ...], ...]
    utilisation: float | None = None


def one_at_a_time(model, tokenizer, work: Work) -> Served:
    """Chapter 1's cached loop, one request after the other."""
    start = time.perf_counter()
    outs = [generate_with_cache(model, tokenizer, p, greedy(n)) for p, n in work]
    return Served(time.perf_counter() - start, tuple(tuple(o.token_ids) for o in outs))


def static_batches(llm: LLM, work: Work) -> Served:
    """The whole workload through `llm`'s engine at once; the utilisation of this run's steps."""
    first = llm.engine.trace.next_step
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in work], [greedy(n) for _, n in work], use_tqdm=False)
    seconds = time.perf_counter() - start
    trace = llm.engine.trace
    steps = [s for s in trace.steps if s.step >= first]
    busy = sum(s.busy_slots for s in steps) / (len(steps) * trace.num_slots)
    return Served(seconds, tuple(tuple(o.token_ids) for o in outs), busy)


def serial_vs_static(model, tokenizer, work: Work, slots: int = 8, rounds: int = 3) -> Finding:
    """`work` one request at a time and in static batches of `slots`, alternating, `rounds` times
    each. numbers: tokens, serial_tok_s and static_tok_s (each from its fastest run), speedup (the
    median of per-round ratios), utilisation (the static runs' busy share of slot-steps)."""
    llm = LLM(config=EngineConfig(batching="static", max_num_seqs=slots, max_model_len=256))
    static = f"static, B={slots}"
    trials = interleaved({"one at a time": partial(one_at_a_time, model, tokenizer, work),
                          static: partial(static_batches, llm, work)}, rounds)
    same_tokens(trials, "static batching", lambda run: run.token_ids)
    return describe_serial_vs_static(trials, sum(n for _, n in work), slots)


def describe_serial_vs_static(trials: Trials, tokens: int, slots: int) -> Finding:
    seconds = lambda run: run.seconds  # noqa: E731
    static = f"static, B={slots}"
    speedup = trials.ratio("one at a time", static, seconds)
    serial_rate, static_rate = tokens / trials.best("one at a time", seconds), tokens / trials.best(static, seconds)
    utilisation = trials.results[static][-1].utilisation
    holds = speedup.value > 1 and speedup.agrees
    rounds_text = speedup.rounds("{:.1f}x")
    if holds:
        text = (f"Static batches of {slots} served the same {tokens} tokens {speedup.value:.1f}x as fast as one "
                f"request at a time ({static_rate:.0f} against {serial_rate:.0f} tok/s, each from the fastest of "
                f"{trials.rounds} runs; {speedup.value:.1f}x is the median of the per-round speed-ups {rounds_text}).")
        if speedup.value < slots:
            text += (f" That is below {slots}, the requests a batch step serves: each batch step costs more than a "
                     f"one-request step (section 1), and {1 - utilisation:.0%} of the batch's slot-steps sat idle, "
                     "everyone in a batch waiting for its longest member.")
        else:
            text += (f" That is at least the {slots} requests a batch step serves, even though "
                     f"{1 - utilisation:.0%} of the batch's slot-steps sat idle: here a batch step cost about what a "
                     "one-request step does.")
    else:
        text = (f"Here static batching was not faster than one request at a time in every round (speed-ups "
                f"{rounds_text}), though every batch step serves up to {slots} requests: other work on the machine "
                "decided these numbers. If no warning follows, rerun this cell.")
    numbers = {"tokens": tokens, "serial_tok_s": serial_rate, "static_tok_s": static_rate,
               "speedup": speedup.value, "utilisation": utilisation}
    return Finding(text, holds, numbers, trials)
