"""ch06.choose_chunk's random cases bite on every term of the step model: a learner walk saw a
choose_chunk whose decode contexts never grew pass them (only its dedicated rule caught it), because
the cases had few decodes on short prompts, where that growth hardly moves a step."""

from __future__ import annotations

from exercises.grading import run
from tests.exercises.wrong_answers import choose_chunk_with_fixed_contexts, choose_chunk_without_the_decodes

RANDOM = "Matches the step-cost model on 200 random cases"


def _failed(impl) -> list[str]:
    return [r.line() for r in run("ch06.choose_chunk", impl) if not r.passed]


def test_fixed_decode_contexts_fail_the_random_cases_too():
    failures = _failed(choose_chunk_with_fixed_contexts)
    assert any("A decode's context grows by one every step" in line for line in failures), "\n".join(failures)
    assert any(RANDOM in line for line in failures), "\n".join(failures)


def test_leaving_out_the_decodes_fails_the_random_cases_too():
    assert any(RANDOM in line for line in _failed(choose_chunk_without_the_decodes))
