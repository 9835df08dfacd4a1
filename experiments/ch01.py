"""Chapter 1's live experiments, each run interleaved and repeated (`minillm/timing.py`), its words
computed from its numbers and the busy-machine guard beside them:

* `naive_step_growth` — one step of the naive loop early and late in an answer;
* `cache_vs_no_cache` — both loops of `minillm/generate.py` on answers of growing length;
* `queue_ttft` — a server that handles one request at a time, and what its queue does to TTFT;
* `ttft_breakdown` — where a request's own part of its TTFT goes;
* `fit_latency_model` — T_prefill(L) = p0 + p1 L + p2 L² and T_decode(c) = d0 + d1 c fitted to a lone
  request's measured steps (`LatencyFit`, which later chapters reuse), and `quadratic_text`, the words
  about its L² term;
* `check_latency_model` — the fit's predictions against whole requests it never saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import combinations

import numpy as np
import torch

from experiments import Finding
from minillm import SamplingParams
from minillm.attention import DenseAttention
from minillm.generate import GenerationOutput, generate, generate_with_cache, generate_without_cache
from minillm.metrics import RequestMetrics, percentile
from minillm.timing import PairedRatio, Trials, interleaved


def greedy(n: int) -> SamplingParams:
    """Exactly n new tokens, greedy: every run of the same request computes the same tokens."""
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def times(x: float) -> str:
    """A ratio for people: 13x, 2.4x."""
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x"


def _per_round(ratio: PairedRatio) -> str:
    return ratio.rounds(times)


def _token_ids(tokenizer, n: int) -> list[int]:
    """n token ids of Shakespeare-like text: a prompt (or a sequence) of exactly n tokens."""
    return (tokenizer.encode("ROMEO:\n") * n)[:n]


# --- the naive loop's step, early and late in an answer -------------------------------------------

@torch.inference_mode()
def naive_step_s(model, ids: torch.Tensor) -> float:
    """One step of the naive loop: a forward pass over the whole sequence so far, then the last
    position's logits (the next token's)."""
    start = time.perf_counter()
    hidden = model(ids, torch.arange(len(ids), device=ids.device), DenseAttention([len(ids)]))
    model.logits(hidden[-1:])
    return time.perf_counter() - start


def naive_step_growth(model, tokenizer, short: int = 5, long: int = 500, rounds: int = 3) -> Finding:
    """One naive step with `short` and with `long` tokens in the sequence, `rounds` times each,
    alternating. numbers: short_ms, long_ms (each the fastest run), growth (long / short, the median
    of per-round ratios)."""
    ids = {n: torch.tensor(_token_ids(tokenizer, n), device=model.device) for n in (short, long)}
    trials = interleaved({f"{n} tokens": partial(naive_step_s, model, ids[n]) for n in (short, long)}, rounds)
    return describe_naive_step(trials, short, long)


def describe_naive_step(trials: Trials, short: int, long: int) -> Finding:
    a, b = trials.best(f"{short} tokens"), trials.best(f"{long} tokens")
    growth = trials.ratio(f"{long} tokens", f"{short} tokens")
    work = long / short
    holds = growth.value > 1 and growth.agrees
    if holds:
        text = (f"A naive step with {short} tokens in the sequence took {a * 1e3:.1f} ms, with {long} tokens "
                f"{b * 1e3:.1f} ms (each the fastest of {trials.rounds} runs). Both produce exactly one new token, "
                f"yet the later one took {times(growth.value)} the time (the median of the per-round ratios "
                f"{_per_round(growth)}).")
        if growth.value < 0.8 * work:
            text += (f" The work grew {work:.0f}x, the time less: every pass on this tiny model also pays a fixed "
                     "cost — Python, dispatching a few hundred small operations — whatever its length (section 8 "
                     "measures it).")
        elif growth.value <= 1.25 * work:
            text += f" That is about the {work:.0f}x the work grew: the fixed cost of a pass hardly shows here."
        else:
            text += (f" That is more than the {work:.0f}x the work grew: attention compares every pair of tokens, "
                     "and that part grows with the square of the length.")
    else:
        text = (f"Here the {long}-token step was not slower than the {short}-token one in every round (ratios "
                f"{_per_round(growth)}; fastest runs {a * 1e3:.1f} and {b * 1e3:.1f} ms), though it does "
                f"{work:.0f}x the work: something else on the machine took the time. If no warning follows, "
                "rerun this cell.")
    return Finding(text, holds, {"short_ms": a * 1e3, "long_ms": b * 1e3, "growth": growth.value}, trials)


# --- the two loops, without and with the KV cache -------------------------------------------------

@dataclass(frozen=True)
class Timed:
    """One whole generation: how long it took, and the tokens it produced."""

    seconds: float
    token_ids: tuple[int, ...]


def timed_generation(loop: Callable[..., GenerationOutput], model, tokenizer, prompt, params) -> Timed:
    start = time.perf_counter()
    out = loop(model, tokenizer, prompt, params)
    return Timed(time.perf_counter() - start, tuple(out.token_ids))


def cache_vs_no_cache(model, tokenizer, prompt: str = "ROMEO:", lengths: Sequence[int] = (16, 32, 64, 128),
                      rounds: int = 2) -> Finding:
    """`generate_without_cache` and `generate_with_cache` for answers of each length, every round
    running both back to back at every length. numbers: lengths, no_cache_s and cached_s (the
    fastest run of each), speedup (per length, the median of per-round ratios), growth_no_cache and
    growth_cached (longest / shortest answer, medians of per-round ratios)."""
    runs = {}
    for m in lengths:
        runs[f"no cache, {m}"] = partial(timed_generation, generate_without_cache, model, tokenizer, prompt, greedy(m))
        runs[f"KV cache, {m}"] = partial(timed_generation, generate_with_cache, model, tokenizer, prompt, greedy(m))
    trials = interleaved(runs, rounds)
    for m in lengths:
        tokens = {run.token_ids for loop in ("no cache", "KV cache") for run in trials.results[f"{loop}, {m}"]}
        assert len(tokens) == 1, f"the two loops disagree on a {m}-token answer"
    return describe_cache(trials, lengths)


def describe_cache(trials: Trials, lengths: Sequence[int]) -> Finding:
    seconds = lambda run: run.seconds  # noqa: E731
    lengths = list(lengths)
    first, last = lengths[0], lengths[-1]
    no_cache = [trials.best(f"no cache, {m}", seconds) for m in lengths]
    cached = [trials.best(f"KV cache, {m}", seconds) for m in lengths]
    speedup = [trials.ratio(f"no cache, {m}", f"KV cache, {m}", seconds) for m in lengths]
    grew_no_cache = trials.ratio(f"no cache, {last}", f"no cache, {first}", seconds)
    grew_cached = trials.ratio(f"KV cache, {last}", f"KV cache, {first}", seconds)
    faster_growth = PairedRatio("the no-cache growth", "the KV-cache growth",
                                tuple(a / b for a, b in zip(grew_no_cache.per_round, grew_cached.per_round)))
    trials.checked.append(faster_growth)
    holds = (faster_growth.value > 1 and faster_growth.agrees and speedup[-1].value > 1 and speedup[-1].agrees)
    if holds:
        text = (f"{last / first:.0f}x the tokens ({first} → {last}): the no-cache time grew "
                f"{times(grew_no_cache.value)}, the KV-cache time {times(grew_cached.value)} (medians over "
                f"{trials.rounds} rounds; each round ran both loops back to back at every length). ")
        if speedup[-1].value > speedup[0].value:
            text += (f"The longer the answer, the more the cache saves: it was {times(speedup[0].value)} as fast at "
                     f"{first} tokens, {times(speedup[-1].value)} at {last}.")
        else:
            text += (f"The cache was {times(speedup[0].value)} as fast at {first} tokens and "
                     f"{times(speedup[-1].value)} at {last}: its advantage did not widen here, though the naive "
                     "loop's extra work did.")
    else:
        text = (f"Here the rounds do not agree that the no-cache time grows faster (from {first} to {last} tokens "
                f"it grew {_per_round(grew_no_cache)} round by round, the KV-cache time {_per_round(grew_cached)}; "
                f"the cache's speed-up at {last} tokens: {_per_round(speedup[-1])}). The no-cache loop does more "
                "work at every length (both produced the same tokens), so other work on the machine decided these "
                "numbers. If no warning follows, rerun this cell.")
    numbers = {"lengths": lengths, "no_cache_s": no_cache, "cached_s": cached,
               "speedup": [r.value for r in speedup], "growth_no_cache": grew_no_cache.value,
               "growth_cached": grew_cached.value}
    return Finding(text, holds, numbers, trials)


# --- a server that handles one request at a time ---------------------------------------------------

@dataclass
class InLine:
    """One run of the one-at-a-time server: every request arrived at `arrival`; `outputs` in the
    order served."""

    arrival: float
    outputs: list[GenerationOutput]

    @property
    def alone(self) -> list[RequestMetrics]:
        """Each request's clock started when the server picked it up (what `generate` stamps)."""
        return [o.metrics for o in self.outputs]

    @property
    def as_seen(self) -> list[RequestMetrics]:
        """The same token times, against the moment everyone arrived: what the users lived."""
        return [RequestMetrics(self.arrival, m.token_times, m.finish_time) for m in self.alone]

    @property
    def wall_s(self) -> float:
        return self.as_seen[-1].latency

    def ttft(self, view: str, q: float) -> float:
        """The q-th percentile TTFT of `view` ("alone" or "as_seen"), in seconds."""
        return percentile([m.ttft for m in getattr(self, view)], q)


def serve_in_line(model, tokenizer, prompts: Sequence[str], params: SamplingParams) -> InLine:
    """All `prompts` arrive now and are served one after the other with `minillm.generate.generate`."""
    arrival = time.perf_counter()
    return InLine(arrival, [generate(model, tokenizer, p, params) for p in prompts])


def queue_ttft(model, tokenizer, prompts: Sequence[str], params: SamplingParams, rounds: int = 2,
               rerun: str = "this cell") -> Finding:
    """The one-at-a-time server `rounds` times on the same requests. numbers: run (the least
    disturbed run, an `InLine`), p50 and p99 (TTFT as the users lived it / as served alone, the
    medians of per-run ratios)."""
    trials = interleaved({"one at a time": partial(serve_in_line, model, tokenizer, prompts, params)}, rounds,
                         rerun=rerun)
    runs = trials.results["one at a time"]
    tokens = {tuple(tuple(o.token_ids) for o in run.outputs) for run in runs}
    assert len(tokens) == 1, "two runs of the same greedy requests gave different tokens"
    return describe_queue(trials)


def describe_queue(trials: Trials) -> Finding:
    runs = trials.results["one at a time"]
    ratios = {q: PairedRatio(f"TTFT p{q} in line", f"TTFT p{q} served alone",
                             tuple(run.ttft("as_seen", q) / run.ttft("alone", q) for run in runs)) for q in (50, 99)}
    trials.checked.extend(ratios.values())
    p50, p99 = ratios[50], ratios[99]
    holds = p50.value > 1 and p50.agrees
    text = (f"Waiting in line multiplied the median TTFT by {times(p50.value)} and the p99 by {times(p99.value)} "
            f"(the medians of {trials.rounds} runs of the whole queue: {_per_round(p50)} and {_per_round(p99)}); "
            "TPOT is the same in both views (the same tokens at the same times).")
    if not holds:
        text = (f"Here waiting in line did not lengthen the median TTFT in every run ({_per_round(p50)}), which "
                "no queue can do: the clock went wrong. Rerun this cell.")
    best = min(runs, key=lambda run: run.wall_s)
    return Finding(text, holds, {"run": best, "p50": p50.value, "p99": p99.value}, trials)


# --- a request's own part of its TTFT ---------------------------------------------------------------

def ttft_breakdown(replay: Callable[[], tuple[int, int, dict[str, float]]], rounds: int = 5) -> Finding:
    """`replay()` runs one request's own steps by hand and returns (prompt tokens, first token,
    {part: seconds}) with the prefill as the last part; it runs `rounds` times. numbers: prompt_tokens,
    first_token, parts (each part's fastest run, seconds), prefill_vs_rest (the prefill's time over
    the other parts', the median of per-run ratios)."""
    trials = interleaved({"replay": replay}, rounds)
    return describe_breakdown(trials)


def describe_breakdown(trials: Trials) -> Finding:
    runs = trials.results["replay"]
    prompt_tokens, first_token, _ = runs[0]
    assert all(r[:2] == (prompt_tokens, first_token) for r in runs), "two replays of one request disagree"
    names = list(runs[0][2])
    *rest, prefill = names
    parts = {name: min(r[2][name] for r in runs) for name in names}
    ratio = PairedRatio(prefill, " + ".join(rest), tuple(r[2][prefill] / sum(r[2][n] for n in rest) for r in runs))
    trials.checked.append(ratio)
    others = sum(parts[n] for n in rest)
    holds = ratio.value >= 5 and ratio.agrees
    if holds:
        text = (f"The {prompt_tokens}-token prefill with its sampling took {parts[prefill] * 1e3:.1f} ms, "
                f"{times(ratio.value)} the {others * 1e3:.2f} ms of {' and '.join(rest)} together (each part the "
                f"fastest of {trials.rounds} replays, the ratio the median of theirs): on this machine the prefill "
                "dwarfs the bookkeeping.")
    else:
        text = (f"Here {' and '.join(rest)} took {others * 1e3:.2f} ms against the prefill's "
                f"{parts[prefill] * 1e3:.1f} ms (ratios {_per_round(ratio)} over {trials.rounds} replays): not the "
                "wide gap a quiet machine shows for a prompt this long. If no warning follows, rerun this cell.")
    numbers = {"prompt_tokens": prompt_tokens, "first_token": first_token, "parts": parts,
               "prefill_vs_rest": ratio.value}
    return Finding(text, holds, numbers, trials)


# --- the latency model, fitted -----------------------------------------------------------------------

def fit_nonneg(columns: Sequence[Sequence[float]], y: Sequence[float]) -> np.ndarray:
    """Least squares y ≈ Σ coef·column with every coef ≥ 0: fit each subset of the columns and keep
    the best fit whose coefficients are all ≥ 0 (for a few columns, this is exact non-negative least
    squares)."""
    X, y = np.column_stack(columns).astype(float), np.asarray(y, dtype=float)
    best, best_sse = None, float("inf")
    for size in range(1, X.shape[1] + 1):
        for cols in map(list, combinations(range(X.shape[1]), size)):
            coef = np.zeros(X.shape[1])
            coef[cols] = np.linalg.lstsq(X[:, cols], y, rcond=None)[0]
            sse = float(((X @ coef - y) ** 2).sum())
            if (coef >= 0).all() and sse < best_sse:
                best, best_sse = coef, sse
    return best


@dataclass(frozen=True)
class LatencyFit:
    """T_prefill(L) = p0 + p1·L + p2·L² and T_decode(c) = d0 + d1·c, in milliseconds, with the points
    they were fitted to (prompt lengths, prefill times; contexts, decode step times)."""

    p0: float
    p1: float
    p2: float
    d0: float
    d1: float
    lengths: tuple[int, ...]
    prefill_ms: tuple[float, ...]
    contexts: tuple[float, ...]
    decode_ms: tuple[float, ...]

    @classmethod
    def fit(cls, lengths, prefill_ms, contexts, decode_ms) -> LatencyFit:
        L, c = np.asarray(lengths, dtype=float), np.asarray(contexts, dtype=float)
        p0, p1, p2 = fit_nonneg([np.ones(len(L)), L, L ** 2], prefill_ms)
        d0, d1 = fit_nonneg([np.ones(len(c)), c], decode_ms)
        return cls(float(p0), float(p1), float(p2), float(d0), float(d1), tuple(int(x) for x in lengths),
                   tuple(map(float, prefill_ms)), tuple(map(float, contexts)), tuple(map(float, decode_ms)))

    def prefill(self, L):
        return self.p0 + self.p1 * L + self.p2 * L ** 2

    def decode(self, c):
        return self.d0 + self.d1 * c

    def quadratic_share(self, L: float) -> float:
        """The L² term's share of a prefill's time beyond the fixed cost p0 (0 when there is none)."""
        beyond = self.p1 * L + self.p2 * L ** 2
        return self.p2 * L ** 2 / beyond if beyond > 0 else 0.0

    def prefill_errors(self) -> list[float]:
        """How far each measured prefill sits from the curve, relative to the measurement."""
        return [abs(self.prefill(L) - y) / y for L, y in zip(self.lengths, self.prefill_ms)]

    def decode_errors(self) -> list[float]:
        return [abs(self.decode(c) - y) / y for c, y in zip(self.contexts, self.decode_ms)]


def fit_latency_model(model, tokenizer, lengths: Sequence[int] = (16, 256, 512, 768, 1024, 1536),
                      new_tokens: int = 8, rounds: int = 3, rerun: str = "this cell") -> Finding:
    """A lone request of L token ids for every L in `lengths`, `rounds` sweeps (the lengths'
    order rotated each sweep). T_prefill(L) is its fastest TTFT, T_decode at a context of about
    L + new_tokens / 2 its fastest median ITL. numbers: fit (a `LatencyFit`), sweep_fits (one per
    sweep, each fitted on that sweep alone)."""
    probe = greedy(new_tokens)
    prompts = {L: _token_ids(tokenizer, L) for L in lengths}
    runs = {f"L={L}": (lambda L=L: generate(model, tokenizer, prompts[L], probe).metrics) for L in lengths}
    trials = interleaved(runs, rounds, rerun=rerun)
    return describe_fit(trials, lengths, new_tokens)


def describe_fit(trials: Trials, lengths: Sequence[int], new_tokens: int) -> Finding:
    ttft_ms = lambda m: m.ttft * 1e3  # noqa: E731
    step_ms = lambda m: float(np.median(m.itls)) * 1e3  # noqa: E731
    contexts = [L + new_tokens // 2 for L in lengths]  # the mean context of its decode steps
    fit = LatencyFit.fit(lengths, [trials.best(f"L={L}", ttft_ms) for L in lengths], contexts,
                         [trials.best(f"L={L}", step_ms) for L in lengths])
    sweep_fits = [LatencyFit.fit(lengths, [trials.values(f"L={L}", ttft_ms)[r] for L in lengths], contexts,
                                 [trials.values(f"L={L}", step_ms)[r] for L in lengths]) for r in range(trials.rounds)]
    err_prefill, err_decode = max(fit.prefill_errors()), max(fit.decode_errors())
    lines = (f"T_prefill(L) ≈ {fit.p0:.2f} ms + {fit.p1 * 1e3:.1f} µs × L + {fit.p2 * 1e6:.1f} ns × L²   "
             f"(worst point off by {err_prefill:.0%})\n"
             f"T_decode(c)  ≈ {fit.d0:.2f} ms + {fit.d1 * 1e3:.2f} µs × c   (worst point off by {err_decode:.0%})\n")
    holds = err_prefill <= 0.25 and err_decode <= 0.25
    if holds:
        text = lines + (f"Each point is the fastest of {trials.rounds} sweeps over the lengths, so a busy moment "
                        f"hit every length alike; five numbers describe all {2 * len(lengths)} points to within "
                        f"{max(err_prefill, err_decode):.0%}.")
    else:
        worse, which = max((err_prefill, "prefill"), (err_decode, "decode step"))
        errors = fit.prefill_errors() if which == "prefill" else fit.decode_errors()
        L = lengths[int(np.argmax(errors))]
        text = lines + (f"The fit misses the {which} at L = {L} by {worse:.0%}: a busy moment during that length's "
                        "runs, or a cost these five terms cannot describe. If no warning follows, rerun this cell; "
                        "the predictions below are only as good as this fit.")
    return Finding(text, holds, {"fit": fit, "sweep_fits": sweep_fits}, trials)


def quadratic_text(fit: LatencyFit, sweep_fits: Sequence[LatencyFit], L: int, flop_share: float) -> str:
    """Words comparing the fitted L² term's share of a prefill's time beyond p0, at L tokens, with
    attention's share of the prefill's FLOPs there (`flop_share`, counted from the model's shapes)."""
    measured = fit.quadratic_share(L)
    sweeps = [f.quadratic_share(L) for f in sweep_fits]
    paper = (f"On paper, attention is {flop_share:.0%} of a {L:,}-token prefill's FLOPs")
    if fit.p2 == 0:
        text = (f"{paper}, yet the fit found no L² term at all (p₂ = 0): over these lengths attention's cost was too "
                "small against the noise to tell apart from the cost per token.")
    elif measured > 1.5 * flop_share:
        text = (f"{paper}; the fit gives its L² term {measured:.0%} of the time beyond the fixed cost p₀: here "
                "attention costs more per FLOP than the projections' large matrix multiplies.")
    elif measured < flop_share / 1.5:
        text = (f"{paper}; the fit gives its L² term only {measured:.0%} of the time beyond the fixed cost p₀: "
                "attention ran faster per FLOP than the projections here, or the fit put part of its cost into "
                "the linear term.")
    else:
        text = (f"{paper}; the fit gives its L² term {measured:.0%} of the time beyond the fixed cost p₀, about "
                "what the FLOPs predict.")
    if len(sweeps) > 1:
        low, high = min(sweeps), max(sweeps)
        text += f" Fitted on each sweep alone, that share came out between {low:.0%} and {high:.0%}"
        text += (": too wide a spread to read more into the figure than its order of size." if high - low > 0.3
                 else ".")
    return text


# --- the fit's predictions against whole requests -------------------------------------------------

def check_latency_model(model, tokenizer, predict_ms: Callable[[int, int], tuple[float, float]],
                        cases: Sequence[tuple[int, int]] = ((64, 48), (512, 24), (1000, 8)), rounds: int = 2,
                        rerun: str = "this cell") -> Finding:
    """Whole requests of L prompt tokens and M output tokens, each `rounds` times, interleaved;
    `predict_ms(L, M)` returns the model's (TTFT, total) in ms. numbers: rows of (L, M, predicted ms,
    measured ms: the fastest run, error), worst (the largest error)."""
    runs = {f"L={L}, M={M}": partial(generate, model, tokenizer, _token_ids(tokenizer, L), greedy(M))
            for L, M in cases}
    trials = interleaved(runs, rounds, rerun=rerun)
    return describe_check(trials, cases, predict_ms)


def describe_check(trials: Trials, cases, predict_ms) -> Finding:
    rows = []
    for L, M in cases:
        got = trials.best(f"L={L}, M={M}", lambda out: out.metrics.latency) * 1e3
        want = predict_ms(L, M)[1]
        rows.append((L, M, want, got, abs(want - got) / got))
    worst = max(rows, key=lambda row: row[4])
    holds = worst[4] <= 0.25
    if holds:
        text = (f"Five fitted numbers predict a whole request's latency to within {worst[4]:.0%} here (each request "
                f"the fastest of {trials.rounds} runs, the {len(rows)} requests interleaved).")
    else:
        L, M, want, got, err = worst
        text = (f"The worst prediction is off by {err:.0%} (L = {L}, M = {M}: predicted {want:.0f} ms, measured "
                f"{got:.0f} ms). A fit taken at a busier or quieter moment than these runs would do that: if no "
                "warning follows, rerun the fit's cell and this one.")
    return Finding(text, holds, {"rows": rows, "worst": worst[4]}, trials)
