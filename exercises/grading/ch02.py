"""Chapter 2's cases: `ch02.slot_utilisation`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from exercises.grading.ch01 import tiny_model
from exercises.grading.core import call, exercise, expect

utilisation = exercise("ch02.slot_utilisation", "ch02_slot_utilisation", "slot_utilisation")


def _expect_utilisation(impl: Any, steps: list[list[int]], num_slots: int, want: float, why: str,
                        given: str = "") -> None:
    given = given or f"slot_utilisation({steps}, num_slots={num_slots})"
    got = call(given, f"{want:.4f} ({why})", impl, [list(step) for step in steps], num_slots)
    close = isinstance(got, int | float) and abs(got - want) < 1e-9
    expect(close, given, f"{want:.4f} ({why})", got)


@utilisation.case
def counts_the_slots_that_ran_at_least_one_token(impl: Callable) -> None:
    _expect_utilisation(impl, [[12, 5, 0, 1], [1, 1, 0, 1], [0, 1, 0, 0]], 4, 7 / 12,
                        "7 busy slot-steps of 3 steps x 4 slots, however many tokens each ran")


@utilisation.case
def slots_missing_from_a_step_ran_nothing(impl: Callable) -> None:
    _expect_utilisation(impl, [[3], [1, 1]], 4, 3 / 8, "3 busy of 2 steps x 4 slots")


@utilisation.case
def no_steps_is_zero(impl: Callable) -> None:
    _expect_utilisation(impl, [], 4, 0.0, "no steps at all")


@functools.cache
def _engine_trace() -> tuple[tuple[tuple[int, ...], ...], int, float]:
    """(tokens per slot per step, num_slots, the engine's utilisation) of a static-batching run."""
    from minillm.config import EngineConfig
    from minillm.engine import LLMEngine
    from minillm.sampling import SamplingParams

    class _Ids:
        def encode(self, text: str) -> list[int]:
            return list(text.encode())

        def decode(self, ids: list[int], **_: Any) -> str:
            return ""

    engine = LLMEngine(tiny_model(), _Ids(), EngineConfig(batching="static", max_num_seqs=3, max_model_len=64))
    for prompt, n in [([5, 6, 7], 4), ([8, 9], 12), ([10, 11, 12, 13], 7), ([14], 3)]:
        engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    trace = engine.trace
    steps = tuple(tuple(s.num_tokens if s is not None else 0 for s in step.slots) for step in trace.steps)
    return steps, trace.num_slots, trace.slot_utilisation


@utilisation.case
def agrees_with_the_engine_trace(impl: Callable) -> None:
    steps, num_slots, want = _engine_trace()
    _expect_utilisation(impl, [list(step) for step in steps], num_slots, want, "the engine's trace.slot_utilisation",
                        f"the {len(steps)} steps of a static-batching run on {num_slots} slots, {list(steps[:3])}...")
