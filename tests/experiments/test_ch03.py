"""Chapter 3's live experiments hold or warn under load, and their words follow their numbers."""

from __future__ import annotations

import pytest

from experiments.ch03 import replay_schedule, scheduler_cost, static_vs_continuous
from tests.cpu_hog import cpu_hog

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/experiments/conftest.py


def test_static_vs_continuous_under_a_cpu_hog_holds_or_warns():
    work = [("ROMEO:", 2), ("What is 1+1? Answer:", 16), ("KING:", 8), ("JULIET:", 8)]
    with cpu_hog():
        finding = static_vs_continuous(work, slots=2, rounds=2)
    assert finding.warning or finding.holds, finding.text
    n = finding.numbers
    assert n["static"].num_steps == 16 + 8 and n["continuous"].num_steps == 2 + 8 + 8  # the schedule's, every run
    assert f"{n['fewer_steps']:.2f}x fewer steps" in finding.text


def test_scheduler_cost_under_a_cpu_hog_holds_or_warns():
    with cpu_hog():
        finding = scheduler_cost([16] * 8, [4, 8, 12, 16] * 2, 4, rounds=3, step_s=0.01, step_name="a test step")
    assert finding.warning or finding.holds, finding.text
    assert f"{finding.numbers['share']:.1%} of a test step (10.0 ms)" in finding.text
    assert finding.numbers["replays"]["static"] != finding.numbers["replays"]["continuous"]  # lengths differ


def test_equal_requests_get_the_same_steps_from_both_schedulers():
    static, _ = replay_schedule("static", [8] * 4, [5] * 4, 2)
    continuous, _ = replay_schedule("continuous", [8] * 4, [5] * 4, 2)
    assert static == continuous and len(static) == 10
