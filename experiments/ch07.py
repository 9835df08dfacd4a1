"""Chapter 7's live experiments: what a pass of the target costs as it carries more tokens (and what a
pass of the draft costs), and the engine with and without speculation on the same passages. Each
runs its configurations interleaved and repeated (`minillm/timing.py`), with ratios taken within a
round, and words computed from the numbers for either outcome."""

from __future__ import annotations

import math
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from experiments import Finding, same_tokens
from minillm import EngineConfig, SamplingParams, SpeculativeConfig
from minillm.attention import ContiguousKVCache
from minillm.engine import LLMEngine, RequestOutput
from minillm.timing import interleaved

SIZES = (1, 2, 3, 4, 5, 6, 7, 16)  # new tokens in a target pass: decode, verification of k = 1..6 guesses, more
PROBE = 5  # the pass the chapter quotes: 4 guesses and the last token


def _pass_timer(model, context: int, new: int, repeats: int) -> Callable[[], float]:
    """A run that times `repeats` forward passes adding `new` tokens after `context` cached ones
    (logits for every new token: verification needs them all) and returns the fastest, in seconds."""
    cache = ContiguousKVCache.for_model(model.config, 1, context + new, model.dtype, model.device)
    prompt = torch.randint(0, model.config.vocab_size, (context + new,), generator=torch.Generator().manual_seed(new))
    with torch.inference_mode():
        model.logits(model(prompt[:context], torch.arange(context), cache.batch([0], [0], [context])))  # fill it

    @torch.inference_mode()
    def run() -> float:
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            hidden = model(prompt[context:], torch.arange(context, context + new), cache.batch([0], [context], [new]))
            model.logits(hidden)
            best = min(best, time.perf_counter() - start)
        return best

    return run


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """Rows as a text table; `align` has one 'l' or 'r' per column."""
    cells = [list(headers), *map(list, rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(row, widths, align)).rstrip()
             for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


class PassCosts(Finding):
    """pass_costs' finding: `show()` prints the guard's warning (when it fired), then the table of the
    passes, then the words about it — so that neither the numbers nor the words come before the warning."""

    def table(self) -> str:
        n = self.numbers
        rounds = len(n["draft_per_round"])
        heads = ["pass", "least disturbed round", "per token", f"in one-token target passes, rounds 1-{rounds}",
                 "median"]
        rows = [[f"target, {size} token{'s' * (size > 1)}", f"{ms:.2f} ms", f"{ms / size:.2f} ms",
                 "  ".join(f"{r:.2f}" for r in n["per_round"][size]) if size > 1 else "(the unit)",
                 f"{n['verify_cost'][size]:.2f}"] for size, ms in n["target_ms"].items()]
        rows.append(["draft, 1 token", f"{n['draft_ms']:.2f} ms", f"{n['draft_ms']:.2f} ms",
                     "  ".join(f"{r:.2f}" for r in n["draft_per_round"]), f"{n['draft_cost']:.2f}"])
        return _table(heads, rows, "lrrrr")

    def show(self) -> None:
        if self.warning:
            print(textwrap.fill(self.warning, 100) + "\n")
        print(self.table() + "\n")
        for paragraph in self.text.split("\n"):
            print(textwrap.fill(paragraph, 100) if paragraph.strip() else "")


def pass_costs(target, draft, context: int = 128, sizes: Sequence[int] = SIZES, rounds: int = 3,
               repeats: int = 5) -> PassCosts:
    """A target pass over each of `sizes` new tokens and a one-token pass of the draft, after `context`
    cached tokens, interleaved over `rounds` (each run: the fastest of `repeats` passes).
    numbers: target_ms {n: the least disturbed round's time}, draft_ms (likewise), verify_cost {n: a
    pass over n tokens in one-token passes, the median of per-round ratios}, draft_cost (c: a draft pass
    in target passes, likewise), per_round {n: the ratios of each round}, draft_per_round.
    The words quote the medians only (the table's last column), and read as provisional when the
    guard fired."""
    sizes = sorted(set(sizes) | {1})
    runs = {f"target {n}": _pass_timer(target, context, n, repeats) for n in sizes}
    runs["draft 1"] = _pass_timer(draft, context, 1, repeats)
    trials = interleaved(runs, rounds, warmup=True, rerun="this cell, then the cells below it that use its numbers")
    target_ms = {n: trials.best(f"target {n}") * 1e3 for n in sizes}
    probe = PROBE if PROBE in sizes else max(sizes)
    # the claims each ratio is judged by: the probe under half its tokens' count; no pass dearer than its tokens
    ratios = {n: trials.ratio(f"target {n}", "target 1", what=f"a pass over {n} tokens",
                              around=probe / 2 if n == probe else n) for n in sizes if n > 1}
    draft = trials.ratio("draft 1", "target 1", what="a draft pass")
    verify = {1: 1.0, **{n: r.value for n, r in ratios.items()}}
    quiet = trials.warning() is None
    dearer = [n for n in ratios if verify[n] > n]  # a pass over n tokens dearer than n one-token passes
    holds = verify[probe] < probe / 2 and not dearer
    if holds and quiet:
        text = (f"Checking {probe} tokens costs {verify[probe]:.2f}x a one-token pass, not {probe}x (the median "
                "column: each round's two passes ran moments apart)")
    elif holds:
        text = (f"In these disturbed rounds, checking {probe} tokens cost {verify[probe]:.2f}x a one-token pass, "
                f"not {probe}x (the median column) — what a quiet machine shows too, but the warning above says "
                "how far to trust these numbers")
    elif dearer:
        worst = max(dearer, key=lambda n: verify[n] / n)
        text = (f"These rounds contradict themselves: a pass over {worst} tokens cost {verify[worst]:.2f}x a "
                f"one-token pass, more than {worst} separate passes would, while {probe} tokens cost "
                f"{verify[probe]:.2f}x a one-token pass. A pass reads the weights once however many tokens it "
                "carries, so no quiet machine does that: other programs took the time, and nothing in this table "
                "can be read as this machine's costs. Rerun the cell once the machine is quiet")
    else:
        text = (f"Here checking {probe} tokens cost {verify[probe]:.2f}x a one-token pass (the median column): not "
                f"much less than {probe} separate passes, so this run does not show the saving speculation spends "
                "— a pass reads the weights once however many tokens it carries. "
                + ("The warning above says why: rerun the cell once the machine is quiet" if not quiet
                   else "No warning fired, so rerun the cell: a burst the guard missed is the likeliest cause"))
    largest = max(sizes)
    if largest != probe and not dearer:
        text += f"; {largest} tokens cost {verify[largest]:.2f}x."
    else:
        text += "."
    text += (f" One pass of the draft model {'costs' if quiet else 'cost, in these rounds,'} c = {draft.value:.2f} "
             "of a one-token target pass (its row's median).")
    numbers = {"target_ms": target_ms, "draft_ms": trials.best("draft 1") * 1e3, "verify_cost": verify,
               "draft_cost": draft.value, "per_round": {n: r.per_round for n, r in ratios.items()},
               "draft_per_round": draft.per_round}
    return PassCosts(text, holds, numbers, trials)


@dataclass
class Generated:
    """One run: the engine (its trace), the outputs in order, the seconds they took, and the
    speculation counts of these requests alone (None without speculation)."""

    engine: LLMEngine
    outputs: list[RequestOutput]
    seconds: float
    counts: dict[str, int] | None

    @property
    def tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def metrics(self) -> dict[str, float] | None:
        """LLMEngine.speculative_metrics for these requests (the warm-up request left out)."""
        c = self.counts
        if c is None:
            return None
        return {"acceptance_rate": c["accepted"] / c["drafted"] if c["drafted"] else 0.0,
                "alpha": c["accepted"] / c["examined"] if c["examined"] else 0.0,
                "tokens_per_pass": c["emitted"] / c["passes"] if c["passes"] else 0.0, **c}


def generate(target, tokenizer, passages: Sequence[Sequence[int]], new_tokens: int,
             spec: SpeculativeConfig | None) -> Generated:
    """The passages one after the other at batch 1, each `new_tokens` greedy tokens, after an untimed
    warm-up request (the engine's first step pays for its fresh buffers)."""
    engine = LLMEngine(target, tokenizer, EngineConfig(max_num_seqs=1, max_model_len=512, speculative=spec))
    engine.add_request(list(passages[0][:8]), SamplingParams(temperature=0, max_new_tokens=4))
    while engine.has_unfinished():
        engine.step()
    before = dict(engine.speculation_counts) if spec is not None else None
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    ids = [engine.add_request(list(p), params).request_id for p in passages]
    while engine.has_unfinished():
        engine.step()
    seconds = time.perf_counter() - start
    counts = ({key: engine.speculation_counts[key] - before[key] for key in before} if before is not None else None)
    return Generated(engine, [engine.output(i) for i in ids], seconds, counts)


def predicted_speedup(tokens_per_pass: float, k: int, costs: Mapping) -> float | None:
    """Section 1's formula on measured costs: tokens per pass / (a pass over k + 1 tokens + k draft
    passes), in one-token target passes; None when `costs` has no pass over k + 1 tokens."""
    verify = costs.get("verify_cost", {}).get(k + 1)
    if verify is None:
        return None
    return tokens_per_pass / (verify + k * costs["draft_cost"])


def speculation_speedup(target, tokenizer, passages: Sequence[Sequence[int]], k: int = 4, new_tokens: int = 64,
                        rounds: int = 3, costs: Mapping | None = None) -> Finding:
    """The engine without speculation and with the draft at `k`, on the same passages, interleaved
    over `rounds`. `costs`: pass_costs' numbers, to set the formula's prediction beside the result.
    numbers: plain_tok_s and spec_tok_s (each the least disturbed round), speedup (the median of the
    per-round ratios) and per_round, predicted (or None), the speculation metrics of the run, and
    the last run of each ("plain", "speculative": a `Generated`). The words quote each round's two
    rates and their ratio (the median of those ratios is the speedup), and read as provisional when
    the guard fired."""
    spec = SpeculativeConfig(method="draft", num_speculative_tokens=k)
    trials = interleaved({"plain": lambda: generate(target, tokenizer, passages, new_tokens, None),
                          "speculative": lambda: generate(target, tokenizer, passages, new_tokens, spec)},
                         rounds, rerun="this cell")
    tokens = same_tokens(trials, "speculation")
    rate = lambda run: run.tok_per_s  # noqa: E731
    speedup = trials.ratio("speculative", "plain", rate, what="output speed")
    plain, fast = max(trials.values("plain", rate)), max(trials.values("speculative", rate))  # least disturbed
    last = trials.results["speculative"][-1]
    m = last.metrics
    assert m is not None
    tpp, predicted = m["tokens_per_pass"], predicted_speedup(m["tokens_per_pass"], k, costs or {})
    holds = speedup.value > 1 and speedup.agrees
    quiet = trials.warning() is None
    # each round's two rates and their ratio: the median quoted is the median of exactly these ratios
    pairs = "; ".join(f"{p:.0f} -> {s:.0f} tokens/s ({r:.2f}x)" for p, s, r in
                      zip(trials.values("plain", rate), trials.values("speculative", rate), speedup.per_round))
    count = sum(len(t) for t in tokens)
    verify = c = None
    if predicted is not None:
        verify, c = costs["verify_cost"][k + 1], costs["draft_cost"]
    pieces = (f"{tpp:.2f} tokens a round, for a pass over {k + 1} tokens costing {verify:.2f} decode steps plus "
              f"{k} draft passes of {c:.2f}") if predicted is not None else ""
    text = (f"Same {count} tokens as plain decoding, {tpp:.2f} per target pass instead of 1. Output speed without "
            f"and with speculation, round by round (the two engines back to back): {pairs}.")
    if holds:
        text += (f" {'So' if quiet else 'In these disturbed rounds'} speculation was {speedup:.2f}x faster (the "
                 "median of the rounds' ratios).")
        if predicted is not None:
            text += f" Section 1's formula on the pass costs measured above predicts {predicted:.2f}x: {pieces}."
    else:
        never = all(r <= 1 for r in speedup.per_round)
        text += (f" {'Here' if quiet else 'In these disturbed rounds'} speculation did not pay"
                 f"{'' if never else ' in every round'}: the median ratio is {speedup:.2f}x.")
        if predicted is not None and predicted <= 1:
            if abs(predicted / speedup.value - 1) <= 0.15:
                text += f" The pass costs measured above predict about that, {predicted:.2f}x:"
            else:
                text += (f" The pass costs measured above predict a loss too, though a "
                         f"{'smaller' if predicted > speedup.value else 'larger'} one: {predicted:.2f}x, against "
                         f"the {speedup:.2f}x measured. By them,")
            text += (f" a round — a pass over {k + 1} tokens costing {verify:.2f} decode steps plus {k} draft passes "
                     f"of {c:.2f} — costs more than the {tpp:.2f} plain decode steps its tokens would have taken.")
            text += (f" On this machine, now, k = {k} does not pay." if quiet else
                     f" If the disturbed rounds are right, k = {k} does not pay here; rerun the cells once the machine "
                     "is quiet to know.")
        elif predicted is not None:
            text += (f" Yet the pass costs measured above predict a gain, {predicted:.2f}x — {pieces} — so the time "
                     "went to what the formula does not count: "
                     + ("other programs, as the warning above says." if not quiet else
                        "the engine's own bookkeeping, or a burst of other work the guard missed. Rerun the cell."))
        else:
            text += (" The warning above says why." if not quiet else
                     " No warning fired: rerun the cell (a burst of other work the guard missed is the likeliest "
                     "cause).")
    text += (f"\nThe target kept {m['acceptance_rate']:.0%} of the draft's guesses (kept / guessed, the figure vLLM "
             f"reports); of the guesses it examined — after a refusal it looks at no more — it kept alpha = "
             f"{m['alpha']:.0%}, the α of section 1.")
    numbers = {"plain_tok_s": plain, "spec_tok_s": fast, "speedup": speedup.value, "per_round": speedup.per_round,
               "predicted": predicted, "k": k, **{key: m[key] for key in ("acceptance_rate", "alpha",
                                                                          "tokens_per_pass")},
               "plain": trials.results["plain"][-1], "speculative": last}
    return Finding(text, holds, numbers, trials)
