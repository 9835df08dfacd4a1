"""Chapter 7's live experiments: what a pass of the target costs as it carries more tokens (and what a
pass of the draft costs), and the engine with and without speculation on the same passages. Each
runs its configurations interleaved and repeated (`minillm/timing.py`), with ratios taken within a
round, and words computed from the numbers for either outcome."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from experiments import Finding
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


def pass_costs(target, draft, context: int = 128, sizes: Sequence[int] = SIZES, rounds: int = 3,
               repeats: int = 5) -> Finding:
    """A target pass over each of `sizes` new tokens and a one-token pass of the draft, after `context`
    cached tokens, interleaved over `rounds` (each run: the fastest of `repeats` passes).
    numbers: target_ms {n: the least disturbed round's time}, draft_ms, verify_cost {n: a pass over n
    tokens in one-token passes, the median of per-round ratios}, draft_cost (c: a draft pass in target
    passes, likewise), per_round {n: the ratios of each round}."""
    sizes = sorted(set(sizes) | {1})
    runs = {f"target {n}": _pass_timer(target, context, n, repeats) for n in sizes}
    runs["draft 1"] = _pass_timer(draft, context, 1, repeats)
    trials = interleaved(runs, rounds, warmup=True, rerun="this cell, then the cells below it that use its numbers")
    target_ms = {n: trials.best(f"target {n}") * 1e3 for n in sizes}
    ratios = {n: trials.ratio(f"target {n}", "target 1") for n in sizes if n > 1}
    draft = trials.ratio("draft 1", "target 1")
    verify = {1: 1.0, **{n: r.value for n, r in ratios.items()}}
    probe = PROBE if PROBE in ratios else max(ratios)
    shown = ", ".join(f"{r:.2f}x" for r in ratios[probe].per_round)
    holds = verify[probe] < probe / 2
    if holds:
        text = (f"Checking {probe} tokens costs {verify[probe]:.2f}x a one-token pass, not {probe}x (the median of "
                f"{shown}, each round's two passes timed back to back)")
    else:
        text = (f"Here checking {probe} tokens cost {verify[probe]:.2f}x a one-token pass ({shown} by round): not "
                f"much less than {probe} separate passes, so this run does not show the saving speculation spends "
                "— a pass reads the weights once however many tokens it carries. If no warning follows, rerun the "
                "cell")
    largest = max(sizes)
    if largest != probe:
        text += f"; {largest} tokens cost {verify[largest]:.2f}x."
    else:
        text += "."
    text += (f" One pass of the draft model costs {trials.best('draft 1') * 1e3:.2f} ms in its least disturbed "
             f"round: c = {draft.value:.2f} of a target pass (the median ratio over {rounds} rounds).")
    numbers = {"target_ms": target_ms, "draft_ms": trials.best("draft 1") * 1e3, "verify_cost": verify,
               "draft_cost": draft.value, "per_round": {n: r.per_round for n, r in ratios.items()}}
    return Finding(text, holds, numbers, trials)


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
    the last run of each ("plain", "speculative": a `Generated`)."""
    spec = SpeculativeConfig(method="draft", num_speculative_tokens=k)
    trials = interleaved({"plain": lambda: generate(target, tokenizer, passages, new_tokens, None),
                          "speculative": lambda: generate(target, tokenizer, passages, new_tokens, spec)},
                         rounds, rerun="this cell")
    runs = [run for results in trials.results.values() for run in results]
    tokens = [o.token_ids for o in runs[0].outputs]
    assert all([o.token_ids for o in run.outputs] == tokens for run in runs), "speculation changed a greedy token"
    rate = lambda run: run.tok_per_s  # noqa: E731
    speedup = trials.ratio("speculative", "plain", rate)
    plain, fast = max(trials.values("plain", rate)), max(trials.values("speculative", rate))  # least disturbed
    last = trials.results["speculative"][-1]
    m = last.metrics
    assert m is not None
    tpp, predicted = m["tokens_per_pass"], predicted_speedup(m["tokens_per_pass"], k, costs or {})
    holds = speedup.value > 1 and speedup.agrees
    shown = ", ".join(f"{r:.2f}x" for r in speedup.per_round)
    count = sum(len(t) for t in tokens)
    pieces = ""
    if predicted is not None:
        verify, c = costs["verify_cost"][k + 1], costs["draft_cost"]
        pieces = (f"{tpp:.2f} tokens a round, for a pass over {k + 1} tokens costing {verify:.2f} decode steps plus "
                  f"{k} draft passes of {c:.2f}")
    if holds:
        text = (f"Same {count} tokens as plain decoding, {tpp:.2f} per target pass instead of 1. Output speed "
                f"{plain:.0f} -> {fast:.0f} tokens/s (each the least disturbed of {rounds} runs); round by round, "
                f"the two engines back to back, speculation was {speedup:.2f}x faster (the median of {shown}).")
        if predicted is not None:
            text += f" Section 1's formula on the pass costs measured above predicts {predicted:.2f}x: {pieces}."
    else:
        never = all(r <= 1 for r in speedup.per_round)
        text = (f"Same {count} tokens as plain decoding, {tpp:.2f} per target pass instead of 1 — yet here "
                f"speculation did not pay{'' if never else ' in every round'}: {plain:.0f} -> {fast:.0f} tokens/s, "
                f"ratios {shown} (the median {speedup:.2f}x).")
        if predicted is not None and predicted <= 1:
            verify, c = costs["verify_cost"][k + 1], costs["draft_cost"]
            text += (f" The pass costs measured above predict as much ({predicted:.2f}x): a round — a pass over "
                     f"{k + 1} tokens costing {verify:.2f} decode steps plus {k} draft passes of {c:.2f} — costs more "
                     f"than the {tpp:.2f} plain decode steps its tokens would have taken. On this machine, now, "
                     f"k = {k} does not pay.")
        elif predicted is not None:
            text += (f" The pass costs measured above predict {predicted:.2f}x — {pieces} — so the time went "
                     "elsewhere, most likely to other programs. If no warning follows, rerun the cell.")
        else:
            text += " If no warning follows, rerun the cell."
    text += (f"\nThe target kept {m['acceptance_rate']:.0%} of the draft's guesses (kept / guessed, the figure vLLM "
             f"reports); of the guesses it examined — after a refusal it looks at no more — it kept alpha = "
             f"{m['alpha']:.0%}, the α of section 1.")
    numbers = {"plain_tok_s": plain, "spec_tok_s": fast, "speedup": speedup.value, "per_round": speedup.per_round,
               "predicted": predicted, "k": k, **{key: m[key] for key in ("acceptance_rate", "alpha",
                                                                          "tokens_per_pass")},
               "plain": trials.results["plain"][-1], "speculative": last}
    return Finding(text, holds, numbers, trials)
