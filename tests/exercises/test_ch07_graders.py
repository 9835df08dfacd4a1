"""ch07.acceptance's FAIL lines name the rule a wrong answer broke, and no other: a learner walk saw a
rule that stops at the first rejection reported as not stopping, because that case also checked
what the replacement was drawn from."""

from __future__ import annotations

from exercises.grading import run
from tests.exercises.wrong_answers import acceptance_resampling_from_p, acceptance_without_the_zero_sum_fallback

STOPS = "Nothing after the first rejected guess"


def _failed(impl) -> list[str]:
    return [r.line() for r in run("ch07.acceptance", impl) if not r.passed]


def test_drawing_from_p_instead_of_the_residual_is_not_called_a_failure_to_stop():
    failures = _failed(acceptance_resampling_from_p)
    assert any("At the first rejection" in line for line in failures), "\n".join(failures)
    assert not any(STOPS in line for line in failures), "\n".join(failures)


def test_the_zero_sum_fallback_is_graded_on_its_own():
    failures = _failed(acceptance_without_the_zero_sum_fallback)
    assert len(failures) == 1 and "residual summing to 0" in failures[0], "\n".join(failures)
    assert "ZeroDivisionError" in failures[0] and "draw from p[0]" in failures[0]
