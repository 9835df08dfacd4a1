"""Chapter 6's cases: `ch06.chunked_step` (one step of the chunked-prefill scheduler)."""

from __future__ import annotations

import random
from collections.abc import Callable
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
