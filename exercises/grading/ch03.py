"""Chapter 3's cases: `ch03.schedule_step`."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from exercises.grading.core import call, exercise, expect

schedule_step = exercise("ch03.schedule_step", "ch03_schedule_step", "plan_step")

Plan = tuple[list[tuple[str, int]], list[str]]


def _plan(impl: Any, running: list[tuple[str, int]], waiting: list[tuple[str, int]], free_slots: int,
          budget: int, want: Plan, why: str, given: str = "") -> None:
    given = given or f"running {running}, waiting {waiting}, free_slots={free_slots}, max_tokens_per_step={budget}"
    expected = f"runs {want[0]}, admits {want[1]} ({why})"
    got = call(given, expected, impl, list(running), list(waiting), free_slots, budget)
    ok = isinstance(got, tuple | list) and len(got) == 2 and all(isinstance(part, list | tuple) for part in got)
    runs, admitted = ([tuple(r) if isinstance(r, list) else r for r in got[0]], list(got[1])) if ok else (None, None)
    expect(ok and runs == want[0] and admitted == want[1], given, expected,
           f"runs {runs}, admits {admitted}" if ok else repr(got))


@schedule_step.case
def running_requests_come_first_then_newcomers_in_arrival_order(impl: Callable) -> None:
    _plan(impl, [("a", 1), ("b", 1)], [("c", 10), ("d", 20)], 2, 100,
          ([("a", 1), ("b", 1), ("c", 10), ("d", 20)], ["c", "d"]), "everything fits")


@schedule_step.case
def a_running_request_that_does_not_fit_waits_and_the_others_go_on(impl: Callable) -> None:
    _plan(impl, [("a", 30), ("b", 1), ("c", 1)], [], 0, 20, ([("b", 1), ("c", 1)], []),
          "a needs 30 > 20 and waits; b and c still run")


@schedule_step.case
def admits_only_while_a_slot_is_free(impl: Callable) -> None:
    _plan(impl, [("a", 1)], [("c", 10), ("d", 20)], 1, 100, ([("a", 1), ("c", 10)], ["c"]), "one free slot")
    _plan(impl, [("a", 1)], [("c", 10)], 0, 100, ([("a", 1)], []), "no free slot")


@schedule_step.case
def running_requests_need_no_free_slot(impl: Callable) -> None:
    _plan(impl, [("a", 1), ("b", 1), ("c", 1)], [("d", 5)], 1, 100,
          ([("a", 1), ("b", 1), ("c", 1), ("d", 5)], ["d"]), "a, b, c already hold their slots; d takes the free one")


@schedule_step.case
def admits_only_while_the_prompt_fits_what_is_left_of_the_budget(impl: Callable) -> None:
    _plan(impl, [("a", 1)], [("c", 10), ("d", 20)], 5, 25, ([("a", 1), ("c", 10)], ["c"]),
          "after a (1) and c (10), 14 are left: d (20) does not fit")
    _plan(impl, [("a", 8)], [("c", 10)], 5, 12, ([("a", 8)], []), "a takes 8 of 12: c (10) does not fit in 4")


@schedule_step.case
def a_prompt_that_exactly_fills_the_budget_is_admitted(impl: Callable) -> None:
    _plan(impl, [("a", 1)], [("c", 10)], 1, 11, ([("a", 1), ("c", 10)], ["c"]), "1 + 10 = 11 fits")


@schedule_step.case
def nobody_overtakes_a_waiting_request_that_does_not_fit(impl: Callable) -> None:
    _plan(impl, [], [("big", 50), ("small", 5)], 4, 30, ([], []),
          "big does not fit, and small may not overtake it")


def random_scheduler(rng: random.Random, max_prompt: int = 40, decode_weight: int = 3,
                     max_prefill_chunk: int | None = None) -> tuple[Any, list, list, int, int]:
    """minillm's ContinuousScheduler in a random state: running requests decoding (weight
    `decode_weight` against one for mid-prompt), a waiting queue. Returns (scheduler, running, waiting,
    free slots, budget), the lists as (request id, tokens it needs)."""
    from minillm.request import Request
    from minillm.sampling import SamplingParams
    from minillm.scheduler import ContinuousScheduler

    slots, budget = rng.randint(1, 6), rng.randint(1, 60)
    scheduler = ContinuousScheduler(slots, 512, budget, max_prefill_chunk=max_prefill_chunk)
    for i in range(rng.randint(0, slots)):  # running requests: decoding or mid-prompt
        r = Request(f"r{i}", [1] * rng.randint(1, max_prompt), SamplingParams(), 0.0)
        scheduler.add(r)
        scheduler.waiting.remove(r)
        scheduler._admit(r)
        r.num_computed_tokens = r.num_tokens - rng.choice([1] * decode_weight + [rng.randint(1, r.num_tokens)])
    for i in range(rng.randint(0, 5)):
        scheduler.add(Request(f"w{i}", [1] * rng.randint(1, max_prompt), SamplingParams(), 0.0))
    running = [(r.request_id, r.num_uncomputed_tokens) for r in scheduler.running]
    waiting = [(r.request_id, r.num_uncomputed_tokens) for r in scheduler.waiting]
    return scheduler, running, waiting, len(scheduler.free_slots), budget


def _random_step(rng: random.Random) -> tuple[list, list, int, int, Plan]:
    """A random scheduler state and the engine's ContinuousScheduler's decision on it."""
    scheduler, running, waiting, free, budget = random_scheduler(rng)
    out = scheduler.schedule()
    want = ([(c.request_id, c.num_tokens) for c in out.chunks], [r.request_id for r in out.new_requests])
    return running, waiting, free, budget, want


@schedule_step.case
def matches_the_engine_scheduler_on_random_queues(impl: Callable) -> None:
    rng = random.Random(7)
    for trial in range(50):
        running, waiting, free, budget, want = _random_step(rng)
        _plan(impl, running, waiting, free, budget, want, "minillm's ContinuousScheduler",
              f"trial {trial}: running {running}, waiting {waiting}, free_slots={free}, max_tokens_per_step={budget}")
