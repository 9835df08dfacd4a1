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

A comparison is quoted from numbers that agree with each other: two least-disturbed times and their
ratio, or the round whose ratio is the median and that round's own times, and every round's ratio
beside it. Where the rounds disagree, or the guard fired, the words say the runs cannot tell.

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
                 warm_steps: int = 8, rerun: str = "this cell") -> Finding:
    """The engine's batch-1 decode step against its matrix multiplies alone, interleaved `rounds` times.
    numbers: step_s and matmul_s (both from the round whose matrix-multiply share is the median),
    other_share (the share of that round's step that is not the matrix multiplies), num_ops (operators
    one step dispatches, from torch.profiler) and profile (that step's StepProfile)."""
    trials = interleaved({"the step": lambda: serve(engine, [prompt], new_tokens),
                          "its matrix multiplies": lambda: matmuls_alone(engine.model)},
                         rounds, warmup=True, rerun=rerun)
    return describe_anatomy(trials, profile_decode_step(engine, prompt, "eager, batch 1", warm_steps))


def describe_anatomy(trials: Trials, profile: StepProfile) -> Finding:
    """The words for `step_anatomy`'s trials ("the step": Served, "its matrix multiplies": seconds), quoted
    from the median round: the round whose matrix-multiply share is the median, so that its two times
    and the share agree."""
    share = trials.ratio("its matrix multiplies", "the step", _seconds)  # per round: matmuls / step
    i = median_round(share)
    step_s, matmul_s = _seconds(trials.results["the step"][i]), _seconds(trials.results["its matrix multiplies"][i])
    other = 1 - share.per_round[i]
    ops = profile.num_host_ops
    per_op_us = 1e6 * max(step_s - matmul_s, 0.0) / ops
    rounds = _rounds(share, "{:.0%}")
    holds = share.value <= MATMUL_SHARE_AT_MOST and share.agrees
    disturbed = trials.warning() is not None
    head = (f"A batch-1 decode step took {step_s * 1e3:.2f} ms (the median step of its run), its matrix multiplies "
            f"alone {matmul_s * 1e3:.2f} ms, in round {i + 1}, the round whose share of matrix multiplies is the "
            f"median of the {trials.rounds}. ")
    if holds:
        text = head + (f"Round by round, run back to back, the matrix multiplies were {rounds} of the step: in "
                       f"round {i + 1}, {other:.0%} of it is something else, mostly the host walking through the "
                       f"{ops} operators the step dispatches, one by one (about {per_op_us:.1f} µs each).")
        if disturbed:
            text += (f" On a machine this busy that per-operator figure is inflated, and so is the step: at every "
                     f"operator torch's {trials.cpu.threads} threads wait for one another, and one of them for a "
                     f"core that another program holds. A quiet machine shows a few µs per operator (section 4 "
                     f"prints the course's quiet run); on a busy one, even a single torch thread "
                     f"(torch.set_num_threads(1)) can be faster than several.")
    else:
        text = head + (f"Round by round the matrix multiplies were {rounds} of the step, so here they are most of "
                       f"it, and the host's {ops} dispatches are a small share: on this machine recording the step "
                       f"will have little to remove.")
        if disturbed:
            text += " With the warning above, these numbers may just be disturbed."
    numbers = {"step_s": step_s, "matmul_s": matmul_s, "other_share": other, "num_ops": ops,
               "per_op_us": per_op_us, "profile": profile, "disturbed": disturbed}
    return Finding(text, holds, numbers, trials)


# ----------------------------------------------------------------------------------------------- padding


def padding_cost(engine: LLMEngine, prompts: Sequence[Sequence[int]], batch: int = 9, bucket: int = 16,
                 rounds: int = 3, new_tokens: int = 24, warmup: bool = True, rerun: str = "this cell") -> Finding:
    """Eager decode steps of 1, `batch` and `bucket` requests, interleaved `rounds` times: what padding
    `batch` up to `bucket` costs in rows and in time. numbers: step_s (rows -> least disturbed round),
    growth (step_s[bucket] / step_s[batch], the ratio of the times printed), time_share (the padded step's
    time the padding added: 1 - 1 / growth), row_share ((bucket - batch) / bucket), one_to_bucket
    (step_s[bucket] / step_s[1]), against_rows (the median per-round growth over bucket / batch)."""
    if not 1 < batch < bucket <= min(len(prompts), engine.config.max_num_seqs):
        raise ValueError(f"need 1 < batch < bucket <= the prompts ({len(prompts)}) and max_num_seqs "
                         f"({engine.config.max_num_seqs}), got batch {batch}, bucket {bucket}")
    runs = {_requests(n): (lambda n=n: serve(engine, prompts[:n], new_tokens)) for n in (1, batch, bucket)}
    return describe_padding(interleaved(runs, rounds, warmup=warmup, rerun=rerun), batch, bucket)


def describe_padding(trials: Trials, batch: int, bucket: int) -> Finding:
    """The words for `padding_cost`'s trials ("1 request", "{batch} requests", "{bucket} requests": Served).
    Every "Nx" is the ratio of the times printed beside it; the rounds' own ratios follow it as evidence.
    It concludes only from rounds that agree on a quiet machine, with the larger batch the slower."""
    big, small = _requests(bucket), _requests(batch)
    # the claim, checked by the guard: time grows more slowly than rows (bucket / batch as much time, at most)
    against_rows = _paired(trials, big, small, scale=bucket / batch, check=True)
    per_round = _paired(trials, big, small)
    step_s = {n: trials.best(_requests(n), _seconds) for n in (1, batch, bucket)}
    growth, from_one = step_s[bucket] / step_s[batch], step_s[bucket] / step_s[1]
    row_share, time_share = (bucket - batch) / bucket, max(1 - 1 / growth, 0.0)
    disturbed = trials.warning() is not None
    faster = growth < 1 or any(r < 1 for r in per_round.per_round)  # no step gets faster for more rows
    unclear = disturbed or faster or not against_rows.agrees
    holds = not unclear and against_rows.value < 1
    head = (f"Padding a batch of {batch} up to bucket {bucket} adds {bucket - batch} rows: {row_share:.0%} of the "
            f"rows the step computes. The eager step took {step_s[1] * 1e3:.2f} ms for 1 request, "
            f"{step_s[batch] * 1e3:.2f} ms for {batch} and {step_s[bucket] * 1e3:.2f} ms for {bucket} (each the median "
            f"step of the least disturbed of {trials.rounds} runs). ")
    ratio = (f"{bucket} requests took {growth:.2f}x the time of {batch} ({step_s[bucket] * 1e3:.2f} / "
             f"{step_s[batch] * 1e3:.2f} ms; round by round, each round's two runs: {_rounds(per_round)})")
    if unclear:
        why = []
        if faster:
            why.append(f"{'in some rounds ' if growth >= 1 else ''}the {bucket} requests came out faster than the "
                       f"{batch}, which more rows never make a step")
        if not against_rows.agrees:
            why.append(f"the rounds disagree on whether the time grew less than the rows ({bucket / batch:.2f}x)")
        if disturbed:
            why.append("the machine was busy (the warning above)")
        text = head + (f"Round by round, {bucket} requests took {_rounds(per_round)} the time of {batch}: "
                       + "; ".join(why) + ". These runs cannot tell what the padding costs: rerun "
                       f"{trials.rerun} when the machine is quiet.")
    elif holds:
        cost = f"about {time_share:.0%}" if time_share >= 0.005 else "no share these runs could see"
        text = head + (f"{ratio}; as many more rows would be {bucket / batch:.2f}x. So the padding rows cost "
                       f"{cost} of the padded step's time, not {row_share:.0%}. {bucket} rows took {from_one:.1f}x "
                       f"one row ({step_s[bucket] * 1e3:.2f} / {step_s[1] * 1e3:.2f} ms), not {bucket}x: a decode "
                       f"step streams every weight from memory once, however many rows it multiplies. (Padding "
                       f"rows in a recorded step cost even less: each attends to one token of the pad block.)")
    else:
        text = head + (f"{ratio}: as much as {bucket / batch:.2f}x more rows would. Here the step grew with its rows, "
                       f"as a compute-bound step does, and padding costs about its share of rows in time too.")
    numbers = {"step_s": step_s, "growth": growth, "time_share": time_share, "row_share": row_share,
               "one_to_bucket": from_one, "against_rows": against_rows.value, "unclear": unclear}
    return Finding(text, holds, numbers, trials)


# ----------------------------------------------------------------------------------------------- recorded


def recorded_vs_eager(eager: LLMEngine, recorded: LLMEngine, prompts: Sequence[Sequence[int]],
                      batches: Sequence[int] = (1, 3), rounds: int = 3, new_tokens: int = 48,
                      label: str = "compiled", rerun: str = "this cell") -> Finding:
    """The same prompts (the first n, for each n in `batches`) through both engines, interleaved `rounds`
    times. numbers: rows (per batch: n, bucket, round, eager_s, recorded_s, speedup, rounds — the times
    of the round whose speedup is the median of the rounds, their ratio, and the PairedRatio of every
    round), same_tokens (every run gave the eager engine's tokens), saving_s (eager_s - recorded_s at
    the first batch size, in that round) and agrees (the first batch size's rounds all point one way)."""
    runs = {}
    for n in batches:
        runs[f"eager, {n}"] = lambda n=n: serve(eager, prompts[:n], new_tokens)
        runs[f"{label}, {n}"] = lambda n=n: serve(recorded, prompts[:n], new_tokens)
    buckets = recorded.runner.recorded.buckets if recorded.runner.recorded is not None else []
    return describe_recorded(interleaved(runs, rounds, rerun=rerun), batches, buckets, label)


def median_round(ratio: PairedRatio) -> int:
    """The round whose ratio is the median of the rounds (with an even number, the lower of the middle two)."""
    order = sorted(range(len(ratio.per_round)), key=lambda i: ratio.per_round[i])
    return order[(len(order) - 1) // 2]


def describe_recorded(trials: Trials, batches: Sequence[int], buckets: Sequence[int], label: str) -> Finding:
    """The words for `recorded_vs_eager`'s trials ("eager, n" and "{label}, n": Served). Each batch size is
    quoted by one round, the one whose speedup is the median: its two step times and their ratio, so the
    numbers printed side by side agree; every round's ratio follows."""
    rows = []
    same = True
    for n in batches:
        eager_runs, recorded_runs = trials.results[f"eager, {n}"], trials.results[f"{label}, {n}"]
        same &= all(run.tokens == eager_runs[0].tokens for run in eager_runs + recorded_runs)
        bucket = bucket_for(n, list(buckets)) if buckets else None
        ratio = trials.ratio(f"eager, {n}", f"{label}, {n}", _seconds)
        i = median_round(ratio)
        eager_s, recorded_s = _seconds(eager_runs[i]), _seconds(recorded_runs[i])
        rows.append({"n": n, "bucket": bucket, "round": i + 1, "eager_s": eager_s, "recorded_s": recorded_s,
                     "speedup": eager_s / recorded_s, "rounds": ratio})
    faster = all(r["rounds"].value > 1 and r["rounds"].agrees for r in rows)
    disturbed = trials.warning() is not None
    holds = faster and not disturbed
    each = "; ".join(f"{_requests(r['n'])}{_padded(r['n'], r['bucket'])}: {r['eager_s'] * 1e3:.2f} ms eager, "
                     f"{r['recorded_s'] * 1e3:.2f} ms {label}, {r['speedup']:.2f}x in round {r['round']} "
                     f"(every round: {_rounds(r['rounds'])})" for r in rows)
    how = (f"Per decode step, each batch size quoted by its median round (the round whose speedup is the median "
           f"of the {trials.rounds}; a step time is the median step of that round's run)")
    first = rows[0]
    agrees = first["rounds"].agrees
    saving = first["eager_s"] - first["recorded_s"]
    if faster:
        text = (f"The {label} step was faster at every batch size, in every round. {how}: {each}. At "
                f"{_requests(first['n'])} it saved {saving * 1e3:.2f} ms a step in that round.")
        if disturbed:
            text += " With the warning above, how much it saved is provisional."
    else:
        text = f"Here the {label} step was not faster in every round. {how}: {each}. "
        if disturbed:
            text += (f"A recorded step runs the same arithmetic with fewer dispatches, so this most likely means "
                     f"other work disturbed the runs (the warning above): rerun {trials.rerun} when the machine "
                     f"is quiet.")
        else:
            text += (f"The machine was quiet, so on this one the {label} step does not pay for itself at every "
                     f"batch size.")
    text += f" Same tokens as the eager engine in every run: {same}."
    numbers = {"rows": rows, "same_tokens": same, "saving_s": saving, "agrees": agrees, "disturbed": disturbed}
    return Finding(text, holds, numbers, trials)


def _requests(n: int) -> str:
    return f"{n} request" + ("s" if n != 1 else "")


def _padded(n: int, bucket: int | None) -> str:
    return "" if bucket is None or bucket == n else f" (padded to {bucket})"


# ----------------------------------------------------------------------------------------------- profiles


def launch_profiles(engines: dict[str, LLMEngine], prompt: Sequence[int], rounds: int = 3,
                    warm_steps: int = 8, rerun: str = "this cell") -> Finding:
    """One profiled batch-1 decode step of each engine (label -> engine; the first is the baseline),
    after `warm_steps` steps, interleaved `rounds` times. numbers: profiles (label -> the shortest of
    its profiles)."""
    runs = {label: (lambda e=engine, label=label: profile_decode_step(e, prompt, f"{label}, batch 1", warm_steps))
            for label, engine in engines.items()}
    return describe_profiles(interleaved(runs, rounds, rerun=rerun))


def describe_profiles(trials: Trials) -> Finding:
    """The words for `launch_profiles`' trials (label: StepProfile). The ratio quoted is that of the two
    profiles drawn (the shortest of each); every round's ratio follows."""
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
        drawn = base_p.wall_us / p.wall_us
        longer = (f"{base}'s profile {drawn:.1f}x as long as {label}'s" if drawn >= 1
                  else f"{label}'s profile {1 / drawn:.1f}x as long as {base}'s")
        parts.append(f"{label} {p.num_host_ops} ({base_p.num_host_ops / p.num_host_ops:.1f}x fewer{which}), profiled "
                     f"at {p.wall_us / 1e3:.2f} ms ({longer}; round by round, {base} / {label}: "
                     f"{_rounds(ratio)})")
    text = (f"Operators dispatched in one batch-1 step: {base} {base_p.num_host_ops}, profiled at "
            f"{base_p.wall_us / 1e3:.2f} ms; " + "; ".join(parts) + f". Each profile drawn is the shortest of "
            f"{trials.rounds}.")
    disturbed = trials.warning() is not None
    if not holds:
        text += (" Here the profiled steps did not keep the order of their operator counts in every round"
                 + (": with the warning above, rerun " + trials.rerun + " when the machine is quiet." if disturbed
                    else "."))
    elif disturbed:
        text += " The order held, but with the warning above the times are provisional."
    return Finding(text, holds and not disturbed, {"profiles": best, "disturbed": disturbed}, trials)


# A profiled step this much shorter than the same step measured has met another moment of the machine.
SHORTER = 0.97


def profiler_stretch(live: dict[str, tuple[float, float]], saved: dict[str, tuple[float, float]]) -> str:
    """How much the profiler stretched each step, live and in the saved quiet run: label -> (profiled
    seconds, measured seconds) in each; in words, computed, the saved run's order as what a quiet
    machine shows."""
    def each(steps: dict[str, tuple[float, float]]) -> str:
        return ", ".join(f"{label} {p * 1e3:.2f} ms profiled / {m * 1e3:.2f} ms measured ({p / m:.2f}x)"
                         for label, (p, m) in steps.items())

    stretch = lambda steps: {label: p / m for label, (p, m) in steps.items()}  # noqa: E731
    text = (f"The profiler adds time to every operator. In the course's quiet run (section 4): {each(saved)}, "
            f"so the step with more operators is stretched more. Here, against the steps measured above: "
            f"{each(live)}")
    quiet, here = stretch(saved), stretch(live)
    moments = ("the profiled steps and the measured ones ran at different moments of this machine, and on a busy "
               "one those differ by more than the profiler adds")
    if any(x < SHORTER for x in here.values()):
        shorter = " and ".join(label for label, x in here.items() if x < SHORTER)
        return text + f": here {shorter} profiled shorter than measured, which only means {moments}."
    if sorted(quiet, key=quiet.get) == sorted(here, key=here.get):
        return text + ": the same order."
    return text + f": another order, because {moments}."


def what_recording_removed(anatomy: Finding, versus: Finding, label: str = "compiling",
                           rerun: str = "the first measurement's cell (under the introduction) and this cell") -> str:
    """The batch-1 saving of `recorded_vs_eager` against the part of the step `step_anatomy` found
    outside the matrix multiplies, in words; when `versus`'s rounds went both ways, only that they did."""
    saving, step_s, matmul_s = versus.numbers["saving_s"], anatomy.numbers["step_s"], anatomy.numbers["matmul_s"]
    other = step_s - matmul_s
    rows = versus.numbers.get("rows")
    if rows and not rows[0]["rounds"].agrees:
        return (f"At batch 1 the rounds disagree ({label} against eager: {_rounds(rows[0]['rounds'])}), so these "
                f"runs cannot say what {label} saved. Rerun {rerun} when the machine is quiet.")
    if saving <= 0 or other <= 0:
        return (f"At batch 1 {label} saved nothing measurable here ({saving * 1e3:+.2f} ms a step). If a warning "
                f"came with either measurement, rerun {rerun}.")
    head = f"At batch 1 {label} saved {saving * 1e3:.2f} ms a step"
    warned = [w for w, f in (("the first measurement", anatomy), ("this one", versus)) if f.warning]
    if warned:  # the share, and any reason for it, would be read into disturbed numbers
        relation = "more than" if saving > other else f"{_share(saving / other)} of"
        return (head + f", {relation} the {other * 1e3:.2f} ms the first measurement found outside the matrix "
                f"multiplies. Provisional: {' and '.join(warned)} came with a busy-machine warning, and the two ran "
                f"minutes apart, so the two figures can be off either way; rerun {rerun} when the machine is quiet.")
    if saving > other:
        return (head + f", more than the {other * 1e3:.2f} ms the first measurement found outside the matrix "
                f"multiplies: the recorded step's matrix multiplies ran faster too (pre-packed weights).")
    return (head + f", {_share(saving / other)} of the {other * 1e3:.2f} ms the first measurement found outside the "
            f"matrix multiplies. Their {matmul_s * 1e3:.2f} ms stay: no recording shortens the weights' trip from "
            f"memory, and the scheduling and sampling around the model still run in Python.")


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.005 else "under 1%"
