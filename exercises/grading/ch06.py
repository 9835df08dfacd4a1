"""Chapter 6's cases: `ch06.chunked_step` (one step of the chunked-prefill scheduler) and
`ch06.choose_chunk` (the chunk size for an ITL target, from the fitted step-cost model)."""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from exercises.grading.ch03 import random_scheduler
from exercises.grading.core import call, exercise, expect

chunked_step = exercise("ch06.chunked_step", "ch06_chunked_step", "plan_chunked_step")

Plan = list[tuple[str, int]]


def _plan(impl: Any, running: Plan, waiting: Plan, free_slots: int, budget: int, chunk: int, want: Plan, why: str,
          given: str = "") -> None:
    given = given or (f"running {running}, waiting {waiting}, free_slots={free_slots}, max_tokens_per_step={budget}, "
                      f"max_prefill_chunk={chunk}")
    expected = f"{want} ({why})"
    got = call(given, expected, impl, list(running), list(waiting), free_slots, budget, chunk)
    ok = isinstance(got, list | tuple) and all(isinstance(r, list | tuple) and len(r) == 2 for r in got)
    plan = [tuple(r) for r in got] if ok else None
    expect(ok and plan == want, given, expected, repr(plan if ok else got))


@chunked_step.case
def decodes_come_first_even_before_an_older_prefill(impl: Callable) -> None:
    """Decodes come first, even before an older prefill in progress."""
    _plan(impl, [("p", 50), ("a", 1), ("b", 1)], [], 0, 100, 16, [("a", 1), ("b", 1), ("p", 16)],
          "a and b decode, then p's next chunk")


@chunked_step.case
def a_prefill_gets_at_most_one_chunk(impl: Callable) -> None:
    """A prefill gets at most one chunk per step."""
    _plan(impl, [("p", 50)], [], 0, 100, 16, [("p", 16)], "50 still needed, chunks of 16")
    _plan(impl, [("p", 5)], [], 0, 100, 16, [("p", 5)], "the last piece is shorter than a chunk")


@chunked_step.case
def a_prefill_gets_only_what_is_left_of_the_budget(impl: Callable) -> None:
    """A prefill gets only what is left of the budget."""
    _plan(impl, [("a", 1), ("b", 1), ("p", 50)], [], 0, 10, 16, [("a", 1), ("b", 1), ("p", 8)],
          "the decodes take 2 of 10: p's chunk shrinks to 8")


@chunked_step.case
def prefills_in_progress_go_oldest_first_and_one_left_with_nothing_is_left_out(impl: Callable) -> None:
    """Prefills in progress go oldest first; one left with no budget is left out."""
    _plan(impl, [("p", 40), ("q", 40), ("r", 40)], [], 0, 40, 32, [("p", 32), ("q", 8)],
          "p a whole chunk, q the 8 left, r nothing this step")


@chunked_step.case
def newcomers_come_after_prefills_in_progress(impl: Callable) -> None:
    """Waiting requests come after the prefills in progress, one chunk each."""
    _plan(impl, [("p", 40)], [("n", 30)], 1, 50, 32, [("p", 32), ("n", 18)], "p 32, the newcomer what is left")
    _plan(impl, [("a", 1)], [("n", 10), ("m", 10)], 2, 100, 64, [("a", 1), ("n", 10), ("m", 10)], "everything fits")


@chunked_step.case
def a_prompt_longer_than_the_budget_still_runs_in_chunks(impl: Callable) -> None:
    """A prompt longer than the whole budget still starts: a chunk of what the budget allows."""
    _plan(impl, [], [("long", 500)], 1, 64, 128, [("long", 64)], "500 tokens, 64 this step")


@chunked_step.case
def admission_stops_without_a_free_slot_or_budget(impl: Callable) -> None:
    """Admission stops at the first waiting request without a free slot or budget (first come, first served)."""
    _plan(impl, [("a", 1)], [("x", 5), ("y", 5)], 1, 100, 16, [("a", 1), ("x", 5)], "one free slot")
    _plan(impl, [("a", 1), ("b", 1)], [("x", 5)], 3, 2, 16, [("a", 1), ("b", 1)], "the decodes used the whole budget")


@chunked_step.case
def decodes_beyond_the_budget_wait(impl: Callable) -> None:
    """When the budget is smaller than the decodes, the oldest decodes run."""
    _plan(impl, [("a", 1), ("b", 1), ("c", 1), ("p", 9)], [], 0, 2, 8, [("a", 1), ("b", 1)], "budget 2")


@chunked_step.case
def the_arguments_are_left_unchanged(impl: Callable) -> None:
    """The argument lists are left as they were."""
    running, waiting = [("p", 20), ("a", 1)], [("n", 7)]
    call("plan_chunked_step([('p', 20), ('a', 1)], [('n', 7)], 1, 16, 8)", "no error", impl, running, waiting, 1, 16, 8)
    expect(running == [("p", 20), ("a", 1)] and waiting == [("n", 7)], "the lists after the call", "unchanged",
           f"running {running}, waiting {waiting}")


def _random_step(rng: random.Random) -> tuple[Plan, Plan, int, int, int, Plan]:
    """A random scheduler state and the engine's ContinuousScheduler's decision on it, chunked."""
    chunk = rng.choice([1, 3, 8, 16, 64])
    scheduler, running, waiting, free, budget = random_scheduler(rng, max_prompt=80, decode_weight=2,
                                                                 max_prefill_chunk=chunk)
    out = scheduler.schedule()
    return running, waiting, free, budget, chunk, [(c.request_id, c.num_tokens) for c in out.chunks]


@chunked_step.case
def matches_the_engine_scheduler_on_random_queues(impl: Callable) -> None:
    """Matches minillm's ContinuousScheduler(chunked) on 60 random queues."""
    rng = random.Random(6)
    for trial in range(60):
        running, waiting, free, budget, chunk, want = _random_step(rng)
        _plan(impl, running, waiting, free, budget, chunk, want, "minillm's ContinuousScheduler",
              f"trial {trial}: running {running}, waiting {waiting}, free_slots={free}, max_tokens_per_step={budget}, "
              f"max_prefill_chunk={chunk}")


# ----------------------------------------------------------------------------- ch06.choose_chunk

choose = exercise("ch06.choose_chunk", "ch06_choose_chunk", "choose_chunk")

MS = (8.0, 0.125, 2.0**-13)  # p0, p1, p2 in ms: exact binary fractions, so every sum the cases make is exact


def _prefill_steps(cost: tuple, contexts: list[int], prompt_len: int, size: int) -> list[Fraction]:
    """Each step of the prompt in chunks of `size`, in exact arithmetic: the decodes (one token at
    their context, one longer every step) and the next chunk (n tokens, n·s + n(n+1)/2 pairs)."""
    p0, p1, p2 = (Fraction(c) for c in cost)
    times, start, step = [], 0, 0
    while start < prompt_len:
        n = min(size, prompt_len - start)
        pairs = sum(c + step for c in contexts) + n * start + n * (n + 1) // 2
        times.append(p0 + p1 * (len(contexts) + n) + p2 * pairs)
        start, step = start + n, step + 1
    return times


def _choose(cost: tuple, contexts: list[int], prompt_len: int, target: float, sizes: list[int]) -> int | None:
    within = [(sum(t), max(t), s) for s in sizes if max(t := _prefill_steps(cost, contexts, prompt_len, s))
              <= Fraction(target)]
    return min(within)[2] if within else None  # the earliest first token, then the lightest heaviest step


def _contexts(contexts: list[int]) -> str:
    return f"[{contexts[0]}] * {len(contexts)}" if len(contexts) > 3 and len(set(contexts)) == 1 else repr(contexts)


def _ms(x: Fraction | float) -> str:
    return f"{float(x):.6g}"


def _why(cost: tuple, contexts: list[int], prompt_len: int, target: float, sizes: list[int]) -> str:
    """Each size's heaviest step and first-token time: what the expected answer rests on."""
    parts = []
    for size in sorted(set(sizes)):
        times = _prefill_steps(cost, contexts, prompt_len, size)
        mark = "<=" if max(times) <= Fraction(target) else ">"
        parts.append(f"{size}: {len(times)} steps, heaviest {_ms(max(times))} {mark} {_ms(target)}, first token "
                     f"after {_ms(sum(times))}")
    return "; ".join(parts)


def _pick(impl: Any, cost: tuple, contexts: list[int], prompt_len: int, target: float, sizes: list[int], why: str,
          given: str = "") -> None:
    given = given or (f"choose_chunk(cost={tuple(cost)}, decode_contexts={_contexts(contexts)}, "
                      f"prompt_len={prompt_len}, itl_target={target}, sizes={sizes})")
    want = _choose(cost, contexts, prompt_len, target, sizes)
    expected = f"{want} ({why}. {_why(cost, contexts, prompt_len, target, sizes)})"
    got = call(given, expected, impl, cost, list(contexts), prompt_len, target, list(sizes))
    expect(got == want and (got is None) == (want is None) and not isinstance(got, bool), given, expected, repr(got))


@choose.case
def every_step_of_the_prompt_stays_within_the_target(impl: Callable) -> None:
    """Every step of the prompt stays within the target: its heaviest step decides"""
    _pick(impl, MS, [40] * 8, 1500, 50.0, [32, 64, 128, 256, 512], "chunks of 256 have a step over 50")


@choose.case
def the_decodes_ride_along_in_every_step(impl: Callable) -> None:
    """The decodes ride along in every step: their tokens and their contexts count"""
    _pick(impl, MS, [600] * 48, 1000, 40.0, [64, 128, 256],
          "48 decodes at context 600 add 6 ms of tokens and 3.5 ms of attention to every step")


@choose.case
def a_later_chunk_attends_to_every_token_before_it(impl: Callable) -> None:
    """A later chunk attends to every prompt token before it: the last full chunks are the heaviest steps"""
    _pick(impl, MS, [], 2000, 60.0, [64, 128, 256, 512],
          "chunks of 256: the last ones attend to 1,792 earlier tokens each")


@choose.case
def every_step_counts_not_only_the_last(impl: Callable) -> None:
    """Every step counts, not only the last: a short last chunk is a light step"""
    _pick(impl, MS, [100] * 4, 1030, 100.0, [256, 512], "chunks of 512 leave a last chunk of 6 tokens")


@choose.case
def the_earliest_first_token_comes_with_the_fewest_steps(impl: Callable) -> None:
    """The earliest first token among the sizes within the target: every step pays p0 and the decodes again"""
    _pick(impl, MS, [40] * 8, 1500, 200.0, [512, 32, 128, 64], "every size is within 200; 512 needs 3 steps")


@choose.case
def sizes_that_tie_give_the_lightest_heaviest_step(impl: Callable) -> None:
    """Sizes with the same first-token time: the one whose heaviest step is lightest"""
    _pick(impl, MS, [40] * 8, 1500, 350.0, [1400, 1000],
          "both need 2 steps, so the first token comes at the same time; 1000's heaviest step is lighter than 1400's")
    _pick(impl, MS, [40] * 8, 1500, 250.0, [750, 1000],
          "both need 2 steps; 750's second chunk, 750 tokens after 750 others, is the heaviest")
    _pick(impl, MS, [40] * 8, 1500, 400.0, [4096, 64, 2048],
          "2048 and 4096 both take the whole prompt in one step, the same step: the smaller")


@choose.case
def a_step_exactly_at_the_target_is_within_it(impl: Callable) -> None:
    """A step exactly at the target is within it"""
    heaviest = float(max(_prefill_steps(MS, [40] * 8, 1500, 128)))
    _pick(impl, MS, [40] * 8, 1500, heaviest, [64, 128, 256], f"128's heaviest step is exactly {_ms(heaviest)}")


@choose.case
def a_decodes_context_grows_by_one_every_step(impl: Callable) -> None:
    """A decode's context grows by one every step of the prompt"""
    _pick(impl, MS, [300] * 64, 1500, 9625 / 256, [32, 64],
          "by chunks of 64's last step the 64 decodes attend to 23 more tokens each")


@choose.case
def none_when_no_size_stays_within_the_target(impl: Callable) -> None:
    """None when no size keeps every step within the target"""
    _pick(impl, MS, [40] * 8, 1500, 9.0, [16, 32, 64], "p0 and eight decodes alone take 9.04")
    _pick(impl, MS, [], 600, 10.0, [1000], "one step of 600 tokens")


@choose.case
def choose_leaves_the_arguments_unchanged(impl: Callable) -> None:
    """The argument lists are left as they were"""
    contexts, sizes = [50, 40, 60], [256, 32, 128]
    given = f"choose_chunk(cost={MS}, decode_contexts={contexts}, prompt_len=900, itl_target=40.0, sizes={sizes})"
    call(given, "no error", impl, MS, contexts, 900, 40.0, sizes)
    expect(contexts == [50, 40, 60] and sizes == [256, 32, 128], f"the lists after {given}", "unchanged",
           f"decode_contexts {contexts}, sizes {sizes}")


def _random_case(rng: random.Random) -> tuple[tuple, list[int], int, float, list[int]]:
    """Exact binary fractions everywhere, so that a sum comes out the same in any order."""
    cost = (rng.randint(1, 64) / 4, rng.randint(0, 64) / 256, rng.randint(0, 64) / 2**16)
    many = rng.random() < 0.5  # half the cases: many decodes, whose contexts grow by one every step of the prompt
    contexts = [rng.randint(1, 2000) for _ in range(rng.randint(16, 64) if many else rng.randint(0, 12))]
    prompt_len = rng.randint(1, 3000)
    sizes = rng.sample([8, 16, 24, 32, 48, 64, 100, 128, 200, 256, 384, 500, 512, 1024, 2048, 4096], rng.randint(1, 6))
    heaviest = [max(_prefill_steps(cost, contexts, prompt_len, s)) for s in sizes]
    target = float(rng.choice(heaviest)) if rng.random() < 0.5 else float(rng.choice(heaviest)) * rng.choice(
        [0.5, 0.9, 0.999, 1.1, 2.0])  # 0.999: a size just over the target, by less than its decodes' growth
    return cost, contexts, prompt_len, target, sizes


@choose.case
def matches_the_reference_on_random_cases(impl: Callable) -> None:
    """Matches the step-cost model on 200 random cases"""
    rng = random.Random(606)
    for trial in range(200):
        cost, contexts, prompt_len, target, sizes = _random_case(rng)
        _pick(impl, cost, contexts, prompt_len, target, sizes, "the step-cost model",
              f"trial {trial}: choose_chunk(cost={cost}, decode_contexts={contexts}, prompt_len={prompt_len}, "
              f"itl_target={target}, sizes={sizes})")
