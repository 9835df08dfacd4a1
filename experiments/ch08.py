"""Chapter 8's live experiments. Each runs the configurations it compares interleaved and repeated
(`minillm/timing.py::interleaved`), quotes the least disturbed round or the median of per-round
ratios, and words what it found from those numbers, whichever way they came out:

    step_anatomy       a batch-1 decode step against its matrix multiplies alone: what is left is the
                       host dispatching hundreds of small operators one by one
    padding_cost       eager steps of 1, 9 and 16 requests: padding 9 up to bucket 16 adds 44% of the
                       rows computed, and much less of the time (a decode step reads every weight
                       once, however many rows multiply it)
    recorded_vs_eager  the same prompts through the eager engine and a recorded one (compiled on a
                       CPU, CUDA Graphs on a GPU), at a few batch sizes
    launch_profiles    one profiled decode step per engine, the shortest of a few, for the timeline

A run's step time is the median of its steps in which every request decoded (a burst of other work
lands on a few steps of a run, not on its median).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from experiments import Finding
from minillm.engine import LLMEngine
from minillm.graphs.buckets import bucket_for
from minillm.graphs.step_profile import StepProfile, profile_step
from minillm.model.decoder import CausalLM
from minillm.sampling import SamplingParams
from minillm.timing import PairedRatio, Trials, interleaved

# A step counts as mostly something other than its matrix multiplies when they are below this share of it.
MATMUL_SHARE_AT_MOST = 0.8


@dataclass
class Served:
    """One run of some prompts served together to the end (greedy)."""

    tokens: list[list[int]]  # each request's output token ids, in order
    step_s: float  # the median duration of the steps in which every request decoded
    num_steps: int  # how many such steps there were


def serve(engine: LLMEngine, prompts: Sequence[Sequence[int]], new_tokens: int = 32) -> Served:
    """Serve `prompts` together, each for exactly `new_tokens` greedy tokens; the engine keeps nothing
    of them afterwards."""
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    first = engine.trace.next_step
    ids = [engine.add_request(list(p), params).request_id for p in prompts]
    while engine.has_unfinished():
        engine.step()
    durations = [s.duration for s in engine.trace.steps
                 if s.step >= first and s.decode_tokens == len(prompts) and not s.prefill_tokens]
    if not durations:
        raise ValueError(f"no step decoded all {len(prompts)} requests together: is max_num_seqs >= {len(prompts)} "
                         f"and new_tokens >= 2 (got {new_tokens})?")
    tokens = [engine.output(i).token_ids for i in ids]
    for i in ids:
        engine.release(i)
    return Served(tokens, statistics.median(durations), len(durations))


@torch.inference_mode()
def matmuls_alone(model: CausalLM, repeats: int = 20) -> float:
    """Seconds for a batch-1 step's matrix multiplies only: every Linear layer, and the LM head, on one
    row (the median of `repeats`). Each reads its whole weight matrix, so this is also about the time
    to stream the weights from memory once."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    rows = {m: torch.randn(1, m.in_features, dtype=model.dtype, device=model.device) for m in layers}
    head = torch.randn(1, model.config.hidden_size, dtype=model.dtype, device=model.device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for m in layers:
            m(rows[m])
        model.logits(head)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_decode_step(engine: LLMEngine, prompt: Sequence[int], label: str, warm_steps: int = 8) -> StepProfile:
    """One request decoding alone: `warm_steps` steps, then one step under torch.profiler, then to the end."""
    params = SamplingParams(temperature=0, max_new_tokens=warm_steps + 2, ignore_eos=True)
    request_id = engine.add_request(list(prompt), params).request_id
    for _ in range(warm_steps):
        engine.step()
    profile = profile_step(engine.step, label)
    while engine.has_unfinished():
        engine.step()
    engine.release(request_id)
    return profile


def _seconds(result: Served | float) -> float:
    return result.step_s if isinstance(result, Served) else float(result)


def _paired(trials: Trials, num: str, den: str, scale: float = 1.0, check: bool = False) -> PairedRatio:
    """num / (den x scale), round by round; with `check`, the guard also looks at whether its rounds agree."""
    pairs = zip(trials.values(num, _seconds), trials.values(den, _seconds))
    ratio = PairedRatio(num, den if scale == 1 else f"({den}) x {scale:.2f}", tuple(a / (b * scale) for a, b in pairs))
    if check:
        trials.checked.append(ratio)
    return ratio


def _rounds(ratio: PairedRatio, fmt: str = "{:.2f}x") -> str:
    return ratio.rounds(fmt)


# ----------------------------------------------------------------------------------------------- the anatomy


def step_anatomy(engine: LLMEngine, prompt: Sequence[int], rounds: int = 3, new_tokens: int = 40,
                 warm_steps: int = 8) -> Finding:
    """The engine's batch-1 decode step against its matrix multiplies alone, interleaved `rounds` times.
    numbers: step_s and matmul_s (each the least disturbed round), other_share (the median over rounds of
    the share of the step that is not the matrix multiplies), num_ops (operators one step dispatches,
    from torch.profiler) and profile (that step's StepProfile)."""
    trials = interleaved({"the step": lambda: serve(engine, [prompt], new_tokens),
                          "its matrix multiplies": lambda: matmuls_alone(engine.model)},
                         rounds, warmup=True, rerun="this cell")
    return describe_anatomy(trials, profile_decode_step(engine, prompt, "eager, batch 1", warm_steps))


def describe_anatomy(trials: Trials, profile: StepProfile) -> Finding:
    """The words for `step_anatomy`'s trials ("the step": Served, "its matrix multiplies": seconds)."""
    share = trials.ratio("its matrix multiplies", "the step", _seconds)  # per round: matmuls / step
    step_s, matmul_s = trials.best("the step", _seconds), trials.best("its matrix multiplies", _seconds)
    other = 1 - share.value
    ops = profile.num_host_ops
    per_op_us = 1e6 * max(step_s - matmul_s, 0.0) / ops
    rounds = _rounds(share, "{:.0%}")
    holds = share.value <= MATMUL_SHARE_AT_MOST and share.agrees
    head = (f"A batch-1 decode step took {step_s * 1e3:.2f} ms (the median step of the least disturbed of "
            f"{trials.rounds} runs), its matrix multiplies alone {matmul_s * 1e3:.2f} ms. ")
    if holds:
        text = head + (f"Round by round, run back to back, the matrix multiplies were {rounds} of the step: "
                       f"{other:.0%} of it is something else, mostly the host walking through the {ops} operators "
                       f"the step dispatches, one by one (about {per_op_us:.1f} µs each).")
    else:
        text = head + (f"Round by round the matrix multiplies were {rounds} of the step, so here they are most of "
                       f"it, and the host's {ops} dispatches are a small share: on this machine recording the step "
                       f"will have little to remove. If a warning follows, the numbers may just be disturbed.")
    numbers = {"step_s": step_s, "matmul_s": matmul_s, "other_share": other, "num_ops": ops,
               "per_op_us": per_op_us, "profile": profile}
    return Finding(text, holds, numbers, trials)


# ----------------------------------------------------------------------------------------------- padding


def padding_cost(engine: LLMEngine, prompts: Sequence[Sequence[int]], batch: int = 9, bucket: int = 16,
                 rounds: int = 3, new_tokens: int = 24, warmup: bool = True) -> Finding:
    """Eager decode steps of 1, `batch` and `bucket` requests, interleaved `rounds` times: what padding
    `batch` up to `bucket` costs in rows and in time. numbers: step_s (rows -> least disturbed round),
    growth (median of the per-round ratios bucket / batch), time_share (the padded step's time the
    padding added: 1 - 1 / growth), row_share ((bucket - batch) / bucket), one_to_bucket (median bucket / 1)."""
    if not 1 < batch < bucket <= min(len(prompts), engine.config.max_num_seqs):
        raise ValueError(f"need 1 < batch < bucket <= the prompts ({len(prompts)}) and max_num_seqs "
                         f"({engine.config.max_num_seqs}), got batch {batch}, bucket {bucket}")
    runs = {_requests(n): (lambda n=n: serve(engine, prompts[:n], new_tokens)) for n in (1, batch, bucket)}
    return describe_padding(interleaved(runs, rounds, warmup=warmup, rerun="this cell"), batch, bucket)


def describe_padding(trials: Trials, batch: int, bucket: int) -> Finding:
    """The words for `padding_cost`'s trials ("1 request", "{batch} requests", "{bucket} requests": Served)."""
    big, small, one = _requests(bucket), _requests(batch), _requests(1)
    # the claim, checked by the guard: time grows more slowly than rows (bucket / batch as much time, at most)
    against_rows = _paired(trials, big, small, scale=bucket / batch, check=True)
    growth, from_one = _paired(trials, big, small), _paired(trials, big, one)
    step_s = {n: trials.best(_requests(n), _seconds) for n in (1, batch, bucket)}
    row_share, time_share = (bucket - batch) / bucket, max(1 - 1 / growth.value, 0.0)
    holds = against_rows.value < 1 and against_rows.agrees
    cost = f"about {time_share:.0%}" if time_share >= 0.005 else "no share these runs could see"
    head = (f"Padding a batch of {batch} up to bucket {bucket} adds {bucket - batch} rows: {row_share:.0%} of the "
            f"rows the step computes. The eager step took {step_s[1] * 1e3:.2f} ms for 1 request, "
            f"{step_s[batch] * 1e3:.2f} ms for {batch} and {step_s[bucket] * 1e3:.2f} ms for {bucket} (each the median "
            f"step of the least disturbed of {trials.rounds} runs). ")
    if holds:
        text = head + (f"Round by round, {bucket} requests took {growth:.2f}x the time of {batch} (the median of "
                       f"{_rounds(growth)}; as many more rows would be {bucket / batch:.2f}x), so the padding rows "
                       f"cost {cost} of the padded step's time, not {row_share:.0%}. {bucket} rows "
                       f"took {from_one:.1f}x one row, not {bucket}x: a decode step streams every weight from memory "
                       f"once, however many rows it multiplies. (Padding rows in a recorded step cost even less: "
                       f"each attends to one token of the pad block.)")
    elif against_rows.value >= 1:
        text = head + (f"Round by round, {bucket} requests took {growth:.2f}x the time of {batch} ({_rounds(growth)}), "
                       f"as much as {bucket / batch:.2f}x more rows would: here the step grew with its rows, as a "
                       f"compute-bound step does, and padding costs about its share of rows in time too. If a "
                       f"warning follows, rerun this cell when the machine is quiet.")
    else:
        text = head + (f"Round by round, {bucket} requests took {_rounds(growth)} the time of {batch}: not every "
                       f"round grew by less than the rows ({bucket / batch:.2f}x), so these runs cannot tell what the "
                       f"padding costs. Rerun this cell when the machine is quiet.")
    numbers = {"step_s": step_s, "growth": growth.value, "time_share": time_share, "row_share": row_share,
               "one_to_bucket": from_one.value, "against_rows": against_rows.value}
    return Finding(text, holds, numbers, trials)


# ----------------------------------------------------------------------------------------------- recorded


def recorded_vs_eager(eager: LLMEngine, recorded: LLMEngine, prompts: Sequence[Sequence[int]],
                      batches: Sequence[int] = (1, 3), rounds: int = 3, new_tokens: int = 48,
                      label: str = "compiled") -> Finding:
    """The same prompts (the first n, for each n in `batches`) through both engines, interleaved `rounds`
    times. numbers: rows (per batch: n, bucket, eager_s, recorded_s, speedup — a PairedRatio, eager /
    recorded), same_tokens (every run gave the eager engine's tokens), saving_s (eager_s - recorded_s at
    the first batch size)."""
    runs = {}
    for n in batches:
        runs[f"eager, {n}"] = lambda n=n: serve(eager, prompts[:n], new_tokens)
        runs[f"{label}, {n}"] = lambda n=n: serve(recorded, prompts[:n], new_tokens)
    buckets = recorded.runner.recorded.buckets if recorded.runner.recorded is not None else []
    return describe_recorded(interleaved(runs, rounds, rerun="this cell"), batches, buckets, label)


def describe_recorded(trials: Trials, batches: Sequence[int], buckets: Sequence[int], label: str) -> Finding:
    """The words for `recorded_vs_eager`'s trials ("eager, n" and "{label}, n": Served)."""
    rows = []
    same = True
    for n in batches:
        eager_runs, recorded_runs = trials.results[f"eager, {n}"], trials.results[f"{label}, {n}"]
        same &= all(run.tokens == eager_runs[0].tokens for run in eager_runs + recorded_runs)
        bucket = bucket_for(n, list(buckets)) if buckets else None
        rows.append({"n": n, "bucket": bucket, "eager_s": trials.best(f"eager, {n}", _seconds),
                     "recorded_s": trials.best(f"{label}, {n}", _seconds),
                     "speedup": trials.ratio(f"eager, {n}", f"{label}, {n}", _seconds)})
    holds = all(r["speedup"].value > 1 and r["speedup"].agrees for r in rows)
    each = "; ".join(f"{_requests(r['n'])}{_padded(r['n'], r['bucket'])}: {r['eager_s'] * 1e3:.2f} ms eager, "
                     f"{r['recorded_s'] * 1e3:.2f} ms {label}, {r['speedup']:.2f}x (rounds {_rounds(r['speedup'])})"
                     for r in rows)
    first = rows[0]
    saving = first["eager_s"] - first["recorded_s"]
    if holds:
        text = (f"The {label} step was faster at every batch size, in every round. Per decode step (the median "
                f"step of the least disturbed of {trials.rounds} runs; the speedup, the median of the per-round "
                f"ratios): {each}. At {_requests(first['n'])} it saved {saving * 1e3:.2f} ms a step.")
    else:
        text = (f"Here the {label} step was not faster in every round: {each}. A recorded step runs the same "
                f"arithmetic with fewer dispatches, so this usually means other work disturbed the runs: if a "
                f"warning follows, rerun this cell when the machine is quiet.")
    text += f" Same tokens as the eager engine in every run: {same}."
    return Finding(text, holds, {"rows": rows, "same_tokens": same, "saving_s": saving}, trials)


def _requests(n: int) -> str:
    return f"{n} request" + ("s" if n != 1 else "")


def _padded(n: int, bucket: int | None) -> str:
    return "" if bucket is None or bucket == n else f" (padded to {bucket})"


# ----------------------------------------------------------------------------------------------- profiles


def launch_profiles(engines: dict[str, LLMEngine], prompt: Sequence[int], rounds: int = 3,
                    warm_steps: int = 8) -> Finding:
    """One profiled batch-1 decode step of each engine (label -> engine; the first is the baseline),
    after `warm_steps` steps, interleaved `rounds` times. numbers: profiles (label -> the shortest of
    its profiles)."""
    runs = {label: (lambda e=engine, label=label: profile_decode_step(e, prompt, f"{label}, batch 1", warm_steps))
            for label, engine in engines.items()}
    return describe_profiles(interleaved(runs, rounds, rerun="this cell"))


def describe_profiles(trials: Trials) -> Finding:
    """The words for `launch_profiles`' trials (label: StepProfile)."""
    wall = lambda p: p.wall_us  # noqa: E731
    best = {label: min(results, key=wall) for label, results in trials.results.items()}
    (base, base_p), *others = best.items()
    parts, holds = [], True
    for label, p in others:
        ratio = trials.ratio(base, label, wall)
        holds &= p.num_host_ops < base_p.num_host_ops and ratio.value > 1 and ratio.agrees
        matmuls = sum(1 for s in p.host if "linear" in s.name)
        which = (f"; {matmuls} of them matrix multiplies, the rest fill the buffers and pick the token" if matmuls
                 else "")
        parts.append(f"{label} {p.num_host_ops} ({base_p.num_host_ops / p.num_host_ops:.1f}x fewer{which}), profiled "
                     f"at {p.wall_us / 1e3:.2f} ms ({base}'s profile {ratio:.1f}x as long; rounds "
                     f"{_rounds(ratio, '{:.1f}x')})")
    text = (f"Operators dispatched in one batch-1 step: {base} {base_p.num_host_ops}, profiled at "
            f"{base_p.wall_us / 1e3:.2f} ms; " + "; ".join(parts) + f". Each profile is the shortest of "
            f"{trials.rounds}; the profiler adds time to every operator, so the step with more of them is "
            f"stretched more than the other.")
    if not holds:
        text += (" Here the profiled steps did not keep that order in every round: if a warning follows, rerun "
                 "this cell.")
    return Finding(text, holds, {"profiles": best}, trials)


def what_recording_removed(anatomy: Finding, versus: Finding, label: str = "compiling") -> str:
    """The batch-1 saving of `recorded_vs_eager` against the part of the step `step_anatomy` found
    outside the matrix multiplies, in words."""
    saving, step_s, matmul_s = versus.numbers["saving_s"], anatomy.numbers["step_s"], anatomy.numbers["matmul_s"]
    other = step_s - matmul_s
    if saving <= 0 or other <= 0:
        return (f"At batch 1 {label} saved nothing measurable here ({saving * 1e3:+.2f} ms a step). If a warning "
                f"came with either measurement, rerun the first one (under the introduction) and this cell.")
    head = f"At batch 1 {label} saved {saving * 1e3:.2f} ms a step"
    if saving > other:
        return (head + f", more than the {other * 1e3:.2f} ms the first measurement found outside the matrix "
                f"multiplies: the recorded step's matrix multiplies ran faster too (pre-packed weights).")
    return (head + f", {saving / other:.0%} of the {other * 1e3:.2f} ms the first measurement found outside the "
            f"matrix multiplies. Their {matmul_s * 1e3:.2f} ms stay: no recording shortens the weights' trip from "
            f"memory, and the scheduling and sampling around the model still run in Python.")
