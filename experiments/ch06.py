"""Chapter 6's live experiments: eight requests decoding when a long prompt arrives, served by
chapter 5's engine (the prompt in one step) and by chunked engines, run interleaved round by round
(`minillm/timing.py`); the step-cost model of chapter 1 fitted to their traces; the words computed
from the numbers, with the busy-machine guard beside them.

    step cost  T ≈ p0 + p1 · tokens + p2 · pairs        (chapter 1's prefill model, for a whole step)

    tokens: every token the step computes (one per decode, plus a chunk's prompt tokens)
    pairs:  the attention's query-key pairs: a chunk of n tokens starting at position s adds
            n·s + n(n+1)/2 (the earlier tokens, then its own causal triangle); a decode at context c adds c
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import NamedTuple

import numpy as np

import minillm
from experiments import Finding, same_tokens
from minillm import LLM, EngineConfig, SamplingParams
from minillm.engine import LLMEngine, RequestOutput
from minillm.metrics import percentile
from minillm.timing import PairedRatio, Trials, interleaved
from minillm.trace import StepRecord, Trace

# chapter 5's paged engine, without its prefix cache: every run of the chapter pays for every prompt in full
CHAPTER_5 = EngineConfig(kv="paged", block_size=16, max_num_seqs=16, max_model_len=2048)


def chunked(chunk: int, budget: int | None = None) -> EngineConfig:
    """Chapter 5's engine with chunked prefill: chunks of at most `chunk` tokens (and a step budget)."""
    return dataclasses.replace(CHAPTER_5, chunked_prefill=True, max_tokens_per_prefill_chunk=chunk,
                               max_tokens_per_step=budget or CHAPTER_5.max_tokens_per_step)


def greedy(n: int) -> SamplingParams:
    """Exactly n new tokens, greedy: two runs of the same requests give the same tokens."""
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


@dataclass(frozen=True)
class Workload:
    """Short prompts that start decoding together, and a long prompt that arrives after
    `long_arrives_at` engine steps (`num_long` copies of it, together)."""

    decoders: list[list[int]]
    long_prompt: list[int]
    decode_tokens: int = 60
    long_tokens: int = 4
    long_arrives_at: int = 10
    num_long: int = 1


def workload(num_decoders: int = 8, prompt_len: int = 1500, decoder_len: int = 24, decode_tokens: int = 60,
             num_long: int = 1, long_arrives_at: int = 10) -> Workload:
    """The chapter's requests, cut from the shipped held-out Shakespeare."""
    text = minillm.load_tokenizer().encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    decoders = [text[decoder_len * i : decoder_len * (i + 1)] for i in range(num_decoders)]
    long_prompt = (text * (2 + prompt_len // len(text)))[100 : 100 + prompt_len]
    return Workload(decoders, long_prompt, decode_tokens, long_arrives_at=long_arrives_at, num_long=num_long)


@dataclass
class Served:
    """One run: the engine (its trace) and the outputs, the decoders first, then the long prompts."""

    engine: LLMEngine
    outputs: list[RequestOutput]
    num_decoders: int

    @property
    def trace(self) -> Trace:
        return self.engine.trace

    @property
    def itls(self) -> list[float]:
        """The decoding requests' gaps between consecutive tokens, all of them."""
        return [x for o in self.outputs[: self.num_decoders] for x in o.metrics.itls]

    @property
    def itl_p50(self) -> float:
        return percentile(self.itls, 50)

    @property
    def itl_p99(self) -> float:
        return percentile(self.itls, 99)

    @property
    def worst_gap(self) -> float:
        return max(self.itls)

    @property
    def after_arrival(self) -> list[StepRecord]:
        """The steps from the one that admitted the (first) long prompt on."""
        first = next(i for i, s in enumerate(self.trace.steps) if "long" in s.admitted)
        return self.trace.steps[first:]

    @property
    def longest_step(self) -> float:
        return max(s.duration for s in self.after_arrival)

    @property
    def most_tokens(self) -> int:
        return max(s.num_tokens for s in self.after_arrival)

    @property
    def ttfts(self) -> list[float]:
        return [o.metrics.ttft for o in self.outputs[self.num_decoders :]]

    @property
    def ttft(self) -> float:
        """The (first) long prompt's time to first token."""
        return self.ttfts[0]

    @property
    def prompt_steps(self) -> int:
        """Steps that ran a piece of the (first) long prompt."""
        return sum("long" in s.prefill_tokens for s in self.trace.steps)

    @property
    def engine_time(self) -> float:
        """Seconds the engine spent in its steps: the least disturbed run has the least."""
        return sum(s.duration for s in self.trace.steps)

    @property
    def tokens(self) -> list[list[int]]:
        return [o.token_ids for o in self.outputs]


def serve(config: EngineConfig, work: Workload) -> Served:
    """The decoders start together; after `long_arrives_at` steps the long prompt(s) arrive."""
    engine = LLM(config=config).engine
    ids = [engine.add_request(p, greedy(work.decode_tokens)).request_id for p in work.decoders]
    for _ in range(work.long_arrives_at):
        engine.step()
    ids += [engine.add_request(work.long_prompt, greedy(work.long_tokens),
                               request_id="long" if k == 0 else f"long{k + 1}").request_id
            for k in range(work.num_long)]
    while engine.has_unfinished():
        engine.step()
    return Served(engine, [engine.output(i) for i in ids], len(work.decoders))


# ----------------------------------------------------------------------------- the step-cost model


def step_work(step: StepRecord, before: StepRecord | None) -> tuple[int, int]:
    """(tokens, attention pairs) of a recorded step. A request's chunk of n tokens ends where its KV
    stands after the step (`kv_tokens`), so it started n earlier; one that finished in this step is no
    longer listed, and started where it stood before."""
    tokens = pairs = 0
    for slot in step.slots:
        if slot is None or slot.num_tokens == 0:
            continue
        n = slot.num_tokens
        if slot.request_id in step.kv_tokens:
            start = step.kv_tokens[slot.request_id] - n
        else:
            start = before.kv_tokens.get(slot.request_id, 0) if before is not None else 0
        tokens += n
        pairs += n * start + n * (n + 1) // 2
    return tokens, pairs


def fit_nonneg(columns: Sequence[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Least squares y ≈ Σ coef·column with every coef ≥ 0, as chapter 1 fits it: each subset of the
    columns, the best fit whose coefficients are all ≥ 0 (exact for a few columns)."""
    x, y = np.column_stack(columns).astype(float), np.asarray(y, dtype=float)
    best, best_sse = np.zeros(x.shape[1]), float("inf")
    for size in range(1, x.shape[1] + 1):
        for cols in map(list, combinations(range(x.shape[1]), size)):
            coef = np.zeros(x.shape[1])
            coef[cols] = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            sse = float(((x @ coef - y) ** 2).sum())
            if (coef >= 0).all() and sse < best_sse:
                best, best_sse = coef, sse
    return best


class StepCost(NamedTuple):
    """A step's time: p0 + p1 · tokens + p2 · attention pairs (seconds, or any one unit)."""

    p0: float  # every step: the weights read once, the Python and the dispatch
    p1: float  # per token: a row of every matrix product, its K/V written
    p2: float  # per query-key pair of attention

    def time(self, tokens: int, pairs: int) -> float:
        return self.p0 + self.p1 * tokens + self.p2 * pairs

    def prompt_steps(self, decode_contexts: Sequence[int], prompt_len: int, chunk: int) -> list[float]:
        """The time of each step that runs a piece of a prompt of `prompt_len` tokens, cut into chunks
        of `chunk`, while the requests at `decode_contexts` decode one token each per step (their
        contexts one longer every step). Unchunked is `chunk >= prompt_len`: one step."""
        times, start, j = [], 0, 0
        while start < prompt_len:
            n = min(chunk, prompt_len - start)
            decode_pairs = sum(c + j for c in decode_contexts)
            times.append(self.time(len(decode_contexts) + n, decode_pairs + n * start + n * (n + 1) // 2))
            start, j = start + n, j + 1
        return times

    @classmethod
    def fit(cls, work: Sequence[tuple[int, int]], seconds: Sequence[float]) -> StepCost:
        """Non-negative least squares over steps' (tokens, pairs) and their times."""
        tokens, pairs = (np.array(column, dtype=float) for column in zip(*work))
        return cls(*(float(c) for c in fit_nonneg([np.ones(len(tokens)), tokens, pairs], np.asarray(seconds))))


DISTURBED = 1.5  # a step that took this many times what the fit predicts was slowed by something else


def fit_steps(work: Sequence[tuple[int, int]], seconds: Sequence[float]) -> tuple[StepCost, list[bool]]:
    """`StepCost.fit`, then again without the steps that took more than DISTURBED times the fit's
    prediction (a busy machine only ever adds time, and a few such steps pull every coefficient up),
    until none is left out; returns the model and which steps it kept."""
    kept = [True] * len(seconds)
    for _ in range(5):
        cost = StepCost.fit([w for w, k in zip(work, kept) if k], [t for t, k in zip(seconds, kept) if k])
        again = [t <= DISTURBED * cost.time(*w) for w, t in zip(work, seconds)]
        if again == kept or sum(again) < 3:
            break
        kept = again
    return cost, kept


def least_disturbed_steps(runs: Sequence[Served]) -> tuple[list[tuple[int, int]], list[float]]:
    """The steps of one configuration's rounds, each step's (tokens, pairs) and the least of its times:
    the scheduling does not depend on the clock, so step i ran the same tokens in every round."""
    traces = [run.trace.steps for run in runs]
    assert all(len(t) == len(traces[0]) for t in traces), "the rounds scheduled different steps"
    work, seconds = [], []
    for i, step in enumerate(traces[0]):
        if step.num_tokens:
            work.append(step_work(step, traces[0][i - 1] if i else None))
            seconds.append(min(t[i].duration for t in traces))
    return work, seconds


def decode_contexts_at_arrival(run: Served) -> list[int]:
    """The decoding requests' contexts in the step that admitted the long prompt."""
    step = run.after_arrival[0]
    return [step.kv_tokens[o.request_id] for o in run.outputs[: run.num_decoders] if o.request_id in step.kv_tokens]


# ----------------------------------------------------------------------------- the experiments


def _least_disturbed(trials: Trials[Served], name: str) -> Served:
    return min(trials.results[name], key=lambda run: run.engine_time)


def _same_tokens(trials: Trials[Served], reference: list[list[int]] | None = None, decoders_only: bool = False) -> None:
    cut = (lambda run: run.tokens[: run.num_decoders]) if decoders_only else (lambda run: run.tokens)  # noqa: E731
    tokens = same_tokens(trials, "chunked prefill", cut)
    assert reference is None or tokens == reference, "chunked prefill changed a token"


def _rerun(trials: Trials, cell: str = "the cell") -> str:
    """What to do about words that did not hold: the guard's warning, printed above them, says why when
    it fired; otherwise the machine looked quiet and a rerun shows whether it happens again."""
    if trials.warning():
        return "The warning above says what was disturbed."
    return f"The machine did not look busy, so rerun {cell} to see whether it happens again."


def _tally(r: PairedRatio, claim: str) -> str:
    """"<claim>: shown in 2 of 2 rounds (1.68x, 1.71x)", or "the other way in 2 of 2 rounds (…)"."""
    n, k = len(r.per_round), sum(x > 1 for x in r.per_round)
    return f"{claim}: {f'shown in {k} of {n}' if k else f'the other way in {n} of {n}'} rounds ({r.rounds()})"


def carried_warning(finding: Finding, what: str) -> str | None:
    """For a cell that replays a run of `finding` (a table of its steps, a widget): the guard's findings
    about the rounds it comes from, or None when they held."""
    problems = finding.trials.problems() if finding.trials is not None else []
    if not problems:
        return None
    return (f"⚠ {what} come from runs measured while other work was running ({'; '.join(problems)}): their times "
            f"can be off by a lot. Once the machine is quiet, rerun {finding.trials.rerun}.")


def stall(work: Workload, rounds: int = 2) -> Finding:
    """Chapter 5's engine alone, `rounds` times: how long the decoders waited while the long prompt ran.
    numbers: "run" (the least disturbed `Served`), "itl_p50_s", "prompt_step_s" (the step that ran the
    long prompt) and "stall_s" (the decoders' gap across that step: the step and the bookkeeping before it)."""
    trials = interleaved({"unchunked": lambda: serve(CHAPTER_5, work)}, rounds, rerun="this cell")
    _same_tokens(trials)
    run = _least_disturbed(trials, "unchunked")
    steps = run.trace.steps
    i = next(i for i, s in enumerate(steps) if "long" in s.prefill_tokens)
    step = steps[i].duration
    stall_gap = steps[i].start_time + step - (steps[i - 1].start_time + steps[i - 1].duration)
    p50, worst = run.itl_p50, run.worst_gap
    holds = stall_gap > 5 * p50
    n = len(work.decoders)
    if holds:
        text = (f"The {n} decoding requests got a token every {p50 * 1e3:.0f} ms (median). The step that ran the "
                f"long prompt took {step * 1e3:.0f} ms, and in that step each of them waited for its next token: a "
                f"gap of {stall_gap * 1e3:.0f} ms, {stall_gap / p50:.0f}x the usual one (the least disturbed of "
                f"{rounds} runs).")
    else:
        text = (f"The {n} decoding requests got a token every {p50 * 1e3:.0f} ms (median); the step that ran the "
                f"long prompt took {step * 1e3:.0f} ms, a gap of {stall_gap * 1e3:.0f} ms for each of them. Here "
                f"that gap did not stand out as it should: something else slowed the ordinary steps. "
                + _rerun(trials))
    if worst > 1.2 * stall_gap:
        text += (f" (One gap, {worst * 1e3:.0f} ms, was longer still: something else paused the engine then, not "
                 f"the prompt.)")
    numbers = {"run": run, "itl_p50_s": p50, "prompt_step_s": step, "stall_s": stall_gap, "worst_gap_s": worst}
    return Finding(text, holds, numbers, trials)


def chunk_sweep(work: Workload, sizes: Sequence[int] = (32, 128, 512), rounds: int = 3) -> Finding:
    """Chapter 5's engine and chunked engines (chunks of each of `sizes`) on `work`, interleaved,
    `rounds` rounds. numbers: "runs" (each configuration's least disturbed `Served`, by name:
    "unchunked", "chunks of 32"...), "rows" (per name: the figures of its least disturbed round and
    what the model predicts), "cost" (the `StepCost` fitted to every step of every configuration, each
    step at its least disturbed time), "steps" ({name: (work, seconds, kept by the fit)}),
    "itl_p99_ratio" and "ttft_ratio" (the `PairedRatio`s: unchunked / smallest chunks for the decoders'
    p99 gap, smallest chunks / unchunked for the long prompt's TTFT), "traded" (both ratios held) and
    "order_broken" (the (larger, smaller) neighbours whose longest steps did not fall with the chunk).
    Each row is one round, that configuration's least disturbed (`runs`): the round a replay shows."""
    sizes = sorted(sizes)
    configs = {"unchunked": CHAPTER_5} | {f"chunks of {c}": chunked(c) for c in sizes}
    trials = interleaved({name: (lambda config=config: serve(config, work)) for name, config in configs.items()},
                         rounds, rerun="the cell with `sweep = chunk_sweep(work)` (section 1) and the cells after it, "
                                       "which read its runs")
    _same_tokens(trials)
    measured = {name: least_disturbed_steps(trials.results[name]) for name in configs}
    cost, kept = fit_steps([w for ws, _ in measured.values() for w in ws],
                           [t for _, ts in measured.values() for t in ts])
    steps, offset = {}, 0
    for name, (ws, ts) in measured.items():
        steps[name] = (ws, ts, kept[offset : offset + len(ws)])
        offset += len(ws)
    runs = {name: _least_disturbed(trials, name) for name in configs}
    rows = {}
    for name, config in configs.items():
        chunk = config.max_tokens_per_prefill_chunk if config.chunked_prefill else len(work.long_prompt)
        predicted = cost.prompt_steps(decode_contexts_at_arrival(runs[name]), len(work.long_prompt), chunk)
        run = runs[name]  # one round for the whole row: the one the step table and the widget replay
        rows[name] = {"longest_step_s": run.longest_step, "itl_p50_s": run.itl_p50, "itl_p99_s": run.itl_p99,
                      "ttft_s": run.ttft, "prompt_steps": run.prompt_steps, "predicted_longest_s": max(predicted),
                      "predicted_ttft_s": sum(predicted)}
    small = f"chunks of {sizes[0]}"
    smoother = trials.ratio("unchunked", small, lambda run: run.itl_p99)
    later = trials.ratio(small, "unchunked", lambda run: run.ttft)
    # the heaviest step falls as the chunk shrinks (the model's maximum does, for every fit): unchunked, then
    # the largest chunks down to the smallest
    order = ["unchunked"] + [f"chunks of {c}" for c in reversed(sizes)]
    broken = [(a, b) for a, b in zip(order, order[1:]) if rows[b]["longest_step_s"] >= rows[a]["longest_step_s"]]
    traded = smoother.value > 1 and smoother.agrees and later.value > 1 and later.agrees
    holds = traded and not broken
    plain, chunks = rows["unchunked"], rows[small]
    longest = ", ".join(f"{name} {rows[name]['longest_step_s'] * 1e3:.0f} ms" for name in order)
    if not broken:
        trend = f"The longest step after the arrival fell as the chunk shrank: {longest}."
    else:
        trend = (f"The longest step after the arrival did not fall with the chunk everywhere ({longest}; the model: "
                 + ", ".join(f"{rows[name]['predicted_longest_s'] * 1e3:.0f} ms" for name in order) + "): "
                 + "; ".join(f"{b} broke the order, {rows[b]['longest_step_s'] * 1e3:.0f} ms against "
                             f"{rows[a]['longest_step_s'] * 1e3:.0f} ms for {a}" for a, b in broken)
                 + ". The same steps were scheduled in every round, so something else took that time. "
                 + _rerun(trials, "the sweep's cell"))
    gaps, waits = smoother.rounds("{:.1f}x"), later.rounds()
    if traded:
        text = (f"Chunks of {sizes[0]} cut the decoders' p99 gap from {plain['itl_p99_s'] * 1e3:.0f} ms to "
                f"{chunks['itl_p99_s'] * 1e3:.0f} ms and delayed the long prompt's first token from "
                f"{plain['ttft_s'] * 1e3:.0f} ms to {chunks['ttft_s'] * 1e3:.0f} ms (each engine's least disturbed of "
                f"{rounds} rounds). Round by round, where the two ran back to back, the p99 gap was {smoother:.1f}x "
                f"shorter (the median of {gaps}) and the first token {later:.2f}x later (the median of {waits}): "
                f"smoother decodes, paid for by the long prompt. " + trend)
    else:
        text = (f"Here the trade-off did not show in every round: the p99 gap unchunked / chunks of {sizes[0]} was "
                f"{gaps} and the long prompt's TTFT chunks of {sizes[0]} / unchunked {waits} (least disturbed: p99 "
                f"{plain['itl_p99_s'] * 1e3:.0f} ms against {chunks['itl_p99_s'] * 1e3:.0f} ms, TTFT "
                f"{plain['ttft_s'] * 1e3:.0f} ms against {chunks['ttft_s'] * 1e3:.0f} ms). The same tokens were "
                f"computed either way, so something else took the time. " + trend
                + ("" if broken else " " + _rerun(trials, "the sweep's cell")))
    numbers = {"runs": runs, "rows": rows, "cost": cost, "steps": steps, "sizes": sizes, "itl_p99_ratio": smoother,
               "ttft_ratio": later, "traded": traded, "order_broken": broken}
    return Finding(text, holds, numbers, trials)


def _prefill_until_first_token(run: Served, request_id: str) -> list[int]:
    """The indices of the steps from the long prompts' arrival through the one that ran `request_id`'s last
    chunk (the one that sampled its first token)."""
    steps = run.trace.steps
    first = next(i for i, s in enumerate(steps) if "long" in s.admitted)
    last = max(i for i, s in enumerate(steps) if request_id in s.prefill_tokens)
    return list(range(first, last + 1))


def predicted_ttft(run: Served, request_id: str, cost: StepCost) -> tuple[float, int]:
    """The model's time to `request_id`'s first token: its sum over the steps the run scheduled from the
    long prompts' arrival to that prompt's last chunk; and how many steps that is."""
    steps = run.trace.steps
    span = _prefill_until_first_token(run, request_id)
    return sum(cost.time(*step_work(steps[i], steps[i - 1] if i else None)) for i in span), len(span)


def budgets(work: Workload, budgets: Sequence[int] = (8192, 136), chunk: int = 128, rounds: int = 2,
            cost: StepCost | None = None) -> Finding:
    """Two prompts arrive together (`work.num_long` should be 2); chunks of `chunk` under each step
    budget of `budgets` (the generous one first, the tight one second), interleaved. `cost` (default:
    fitted to these runs' own steps) predicts each prompt's first token from the steps each run
    scheduled. numbers: "runs" ({budget: least disturbed `Served`}), "first_ratio" (the first prompt's
    TTFT, generous / tight), "second_ratio" (the second's, tight / generous), "step_ratio" (the longest
    step, generous / tight), "predicted" ({budget: (first's, second's) predicted TTFT}), "cost".

    The claim is the first two and the cap: the first prompt no longer shares its steps, and no step
    runs more than the tight budget. The second prompt's first token is not part of it: the model puts
    it later (it waits through more steps, each paying p0 and the decodes again), but on a CPU one step
    of two chunks side by side can cost more than the model's sum, so measured it can land either way;
    the words say which, beside the model's figures."""
    loose, tight = budgets
    names = {b: f"budget {b}" for b in budgets}
    trials = interleaved({names[b]: (lambda b=b: serve(chunked(chunk, b), work)) for b in budgets}, rounds,
                         rerun="this cell")
    _same_tokens(trials)
    runs = {b: _least_disturbed(trials, names[b]) for b in budgets}
    if cost is None:
        measured = [least_disturbed_steps(trials.results[names[b]]) for b in budgets]
        cost, _ = fit_steps([w for ws, _ in measured for w in ws], [t for _, ts in measured for t in ts])
    first = trials.ratio(names[loose], names[tight], lambda run: run.ttfts[0], what="the first prompt's TTFT")
    second = trials.ratio(names[tight], names[loose], lambda run: run.ttfts[-1], what="the second prompt's TTFT")
    step = trials.ratio(names[loose], names[tight], lambda run: run.longest_step, what="the longest step")
    most = max(r.most_tokens for r in trials.results[names[tight]])
    capped = most <= tight
    holds = capped and all(r.value > 1 and r.agrees for r in (first, step))
    a, b = runs[loose], runs[tight]
    ids = [o.request_id for o in a.outputs[a.num_decoders :]]
    predicted = {budget: tuple(predicted_ttft(runs[budget], i, cost) for i in (ids[0], ids[-1])) for budget in budgets}
    (_, loose_steps), (_, tight_steps) = predicted[loose][-1], predicted[tight][-1]
    model_later = predicted[tight][-1][0] / predicted[loose][-1][0]
    model = (f"the step-cost model, summing the steps each run scheduled, puts it at "
             f"{predicted[tight][-1][0] * 1e3:.0f} ms against {predicted[loose][-1][0] * 1e3:.0f} ms "
             f"({model_later:.2f}x {'later' if model_later >= 1 else 'sooner'}: it waits through {tight_steps} steps "
             f"instead of {loose_steps}, each paying p0 and the decodes again)")
    if all(x > 1 for x in second.per_round):
        landed = (f"came later in every round ({b.ttfts[-1] * 1e3:.0f} ms against {a.ttfts[-1] * 1e3:.0f} ms), "
                  f"and {model}.")
    elif all(x < 1 for x in second.per_round):
        landed = (f"came sooner in every round ({b.ttfts[-1] * 1e3:.0f} ms against {a.ttfts[-1] * 1e3:.0f} ms), "
                  f"while {model}. On a CPU one step of two chunks side by side can cost more than two steps of one "
                  f"(the larger matrices fall out of the caches), which the model's p1 · tokens does not see: the "
                  f"second prompt can land either way.")
    else:
        landed = (f"went both ways over the rounds ({second.rounds()}; least disturbed {b.ttfts[-1] * 1e3:.0f} ms "
                  f"against {a.ttfts[-1] * 1e3:.0f} ms), while {model}: within this run's noise.")
    if holds:
        text = (f"With a budget of {tight} no step ran more than {b.most_tokens} tokens (against {a.most_tokens}), "
                f"and the longest step took {b.longest_step * 1e3:.0f} ms instead of {a.longest_step * 1e3:.0f} ms "
                f"({step:.2f}x shorter, the median of per-round ratios). The first prompt, no longer sharing its "
                f"steps, reached its first token {first:.2f}x sooner ({b.ttfts[0] * 1e3:.0f} ms against "
                f"{a.ttfts[0] * 1e3:.0f} ms). The second, which waited for room, {landed}")
    else:
        shown = "; ".join((_tally(first, f"the first prompt's first token sooner under {tight}"),
                           _tally(step, f"the longest step shorter under {tight}")))
        text = (f"Here the budget's effect did not show in every round — {shown}; the most tokens in a step under "
                f"the budget of {tight}: {most}{'' if capped else ', over the budget'}. The second prompt, which "
                f"waited for room, {landed} " + _rerun(trials))
    numbers = {"runs": runs, "first_ratio": first, "second_ratio": second, "step_ratio": step,
               "predicted": {budget: (p[0][0], p[1][0]) for budget, p in predicted.items()}, "cost": cost}
    return Finding(text, holds, numbers, trials)


def chosen_chunk(work: Workload, chunk: int, target_s: float, cost: StepCost, rounds: int = 2) -> Finding:
    """The engine with chunks of `chunk`, `rounds` times: did every step after the long prompt's
    arrival stay within `target_s`, as `cost` predicted? numbers: "run" (the least disturbed
    `Served`), "predicted" (the prompt's step times by `cost`)."""
    trials = interleaved({f"chunks of {chunk}": lambda: serve(chunked(chunk), work)}, rounds, rerun="this cell")
    _same_tokens(trials)
    run = _least_disturbed(trials, f"chunks of {chunk}")
    predicted = cost.prompt_steps(decode_contexts_at_arrival(run), len(work.long_prompt), chunk)
    longest, heaviest = run.longest_step, max(predicted)
    holds = longest <= target_s * 1.1  # a tenth of slack: the model's fit is not exact
    verdict = ("within" if longest <= target_s else "just over") if holds else "over"
    text = (f"With chunks of {chunk} the long prompt took {run.prompt_steps} steps; the longest step after it "
            f"arrived took {longest * 1e3:.1f} ms ({verdict} the target of {target_s * 1e3:.1f} ms; the model "
            f"predicted {heaviest * 1e3:.1f} ms), and the decoders' p99 gap was {run.itl_p99 * 1e3:.1f} ms (a gap "
            f"adds the bookkeeping between steps). The long prompt's first token came after {run.ttft * 1e3:.0f} ms "
            f"(the model's sum of its steps: {sum(predicted) * 1e3:.0f} ms). Least disturbed of {rounds} runs.")
    if not holds:
        text += (" The step ran past the target by more than a tenth: either the machine was busy (see the warning "
                 "above, if one fired) or the fitted model underestimates this size — section 1's table shows how far "
                 "its predictions sit from what was measured.")
    return Finding(text, holds, {"run": run, "predicted": predicted}, trials)


def saved_benchmark_words(saved: dict) -> str:
    """What `benchmarks/results/chunked_prefill.json` shows, in words computed from it (so that they stay
    right when the benchmark is rerun): the tail of the decoders' ITL, its median, the long prompts'
    TTFT and the throughput, unchunked against the chunk sizes."""
    meta, rows, ratios = saved["meta"], saved["rows"], saved["ratios"]
    plain, default = rows["unchunked"], meta["default_chunk"]
    sweep = sorted((r["max_tokens_per_prefill_chunk"], r) for r in rows.values() if r["max_tokens_per_prefill_chunk"])
    smallest = sweep[0]
    ms = lambda seconds: f"{seconds * 1e3:.0f} ms"  # noqa: E731
    lowest = min(sweep, key=lambda item: item[1]["itl_p99_s"])
    below = [c for c, _ in sweep if c < lowest[0]]
    upward = [r["itl_p99_s"] for c, r in sweep if c >= lowest[0]]
    order = ("rising with the chunk above that" if all(a <= b for a, b in zip(upward, upward[1:])) else
             "not quite in the order of the chunk sizes above that: neighbours differ by less than the noise")
    tail = (f"The tail of ITL: unchunked, the decoders' p99 gap was {ms(plain['itl_p99_s'])}, the stall of a whole "
            f"prefill; chunked it was {ms(min(r['itl_p99_s'] for _, r in sweep))} to "
            f"{ms(max(r['itl_p99_s'] for _, r in sweep))} (chunks of {default}: "
            f"{ratios['itl_p99_unchunked_vs_chunked']:.1f}x lower than unchunked, the median of {ratios['repeats']} "
            f"paired repeats). ")
    tail += (f"The lowest came with chunks of {lowest[0]} ({ms(lowest[1]['itl_p99_s'])}), {order}; smaller chunks "
             f"did not lower it further — there a step is mostly the decodes themselves." if below else
             f"It was lowest with the smallest chunks tried ({lowest[0]}), {order}.")
    p50s = [r["itl_p50_s"] for _, r in sweep]
    median = (f"The median gap was {ms(plain['itl_p50_s'])} unchunked and between {ms(min(p50s))} and "
              f"{ms(max(p50s))} chunked (chunks of {smallest[0]}: {ms(smallest[1]['itl_p50_s'])}, where a prompt "
              f"needs {-(-meta['prompt_len'] // smallest[0])} steps and rides along in many of the run's steps).")
    # each chunk size against unchunked, repeat by repeat (the repeats ran the engines alternately)
    runs = saved.get("runs", {})
    per_repeat = {c: [x["long_prompt_ttft_p50_s"] / y["long_prompt_ttft_p50_s"]
                      for x, y in zip(runs.get(f"chunk {c}", [r]), runs.get("unchunked", [plain]))] for c, r in sweep}
    later = [c for c, _ in sweep if all(x > 1 for x in per_repeat[c])]
    sooner = [c for c, _ in sweep if all(x < 1 for x in per_repeat[c])]
    mixed = [c for c, _ in sweep if c not in later and c not in sooner]
    sizes = lambda cs: ", ".join(map(str, cs[:-1])) + (" and " if len(cs) > 1 else "") + str(cs[-1])  # noqa: E731
    repeats = len(runs.get("unchunked", [plain]))
    ttft = (f"The long prompts' median TTFT was {ms(plain['long_prompt_ttft_p50_s'])} unchunked; "
            + ", ".join(f"{ms(r['long_prompt_ttft_p50_s'])} in chunks of {c}" for c, r in sweep) + ". ")
    if not sooner and not mixed:
        ttft += (f"The long prompts pay: every chunk size reached the first token later than unchunked, in each of "
                 f"the {repeats} repeats; chunks of {default} against unchunked "
                 f"x{ratios['long_prompt_ttft_chunked_vs_unchunked']:.2f} (paired median).")
    else:
        if later:
            ttft += (f"Chunks of {sizes(later)} paid for their extra steps, later than unchunked in each of the "
                     f"{repeats} repeats (chunks of {default} against unchunked "
                     f"x{ratios['long_prompt_ttft_chunked_vs_unchunked']:.2f}, paired median). ")
        if sooner:
            ttft += (f"Chunks of {sizes(sooner)} reached it sooner than unchunked in each of the {repeats} repeats: "
                     f"not what the step-cost model says (every extra step pays p0 and the decodes again), but not "
                     f"noise either — on a CPU a step of a few hundred tokens can cost less per token than one of "
                     f"{meta['prompt_len']:,} (its matrices stay in the caches), which the model's p1 · tokens does "
                     f"not see. ")
        if mixed:
            ttft += (f"For chunks of {sizes(mixed)} the repeats disagreed on which came first ("
                     + "; ".join(f"{c}: " + ", ".join(f"x{x:.2f}" for x in per_repeat[c]) for c in mixed)
                     + " against unchunked): the difference is within the noise of these runs.")
    ttft = ttft.rstrip()
    rates = [r["output_tok_per_s"] for _, r in sweep]
    throughput = (f"Output tokens per second: {plain['output_tok_per_s']:.0f} unchunked, {min(rates):.0f} to "
                  f"{max(rates):.0f} chunked; chunks of {default} against unchunked "
                  f"x{ratios['tok_per_s_chunked_vs_unchunked']:.2f} (paired median): the same tokens are computed "
                  f"either way, only spread differently over the steps.")
    return "\n".join(f"* {line}" for line in (tail, median, ttft, throughput))
