"""ch08's FAIL lines name the rule a wrong answer broke, and no other: a learner walk saw an attempt that
padded the caller's block tables in place and gave padding rows context 0 reported five times as
"rows left unchanged", the context rule never speaking; and an attempt that never weighs [] and keeps
the first of equally fast choices pass both fixed cases meant for those rules."""

from __future__ import annotations

from exercises.grading import run
from tests.exercises.wrong_answers import (
    buckets_first_of_the_equally_fast,
    buckets_never_all_eager,
    pad_extending_the_tables_and_padding_with_context_zero,
)

UNCHANGED = "The caller's rows are left unchanged"


def _failed(name, impl) -> list[str]:
    return [r.line() for r in run(name, impl) if not r.passed]


def test_changing_the_rows_and_a_wrong_padding_context_are_each_reported_by_their_own_rule():
    failures = _failed("ch08.pad", pad_extending_the_tables_and_padding_with_context_zero)
    assert len(failures) == 3, "\n".join(failures)  # the rows changed; the padding rows; the random batches
    changed = [line for line in failures if "rows left" in line]
    assert len(changed) == 1 and UNCHANGED in changed[0], "\n".join(failures)
    context = [line for line in failures if '"context_lens"' in line and "only the pad block" in line]
    assert len(context) == 1 and "context 1" in context[0] and "got [6, 0, 0, 0]" in context[0], "\n".join(failures)


def test_all_eager_and_the_memory_tie_break_each_have_a_fixed_case():
    never_eager = _failed("ch08.buckets", buckets_never_all_eager)
    assert any("[] may be the fastest choice" in line for line in never_eager), "\n".join(never_eager)
    first_found = _failed("ch08.buckets", buckets_first_of_the_equally_fast)
    assert any("the one that keeps less memory" in line for line in first_found), "\n".join(first_found)
