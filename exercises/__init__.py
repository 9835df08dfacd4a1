"""Graded exercises. Each `chNN_topic.py` holds stubs to fill in; `check("ch04.allocate")` grades
yours with the same cases CI runs (exercises/grading/), `make grade` prints your score."""

from exercises.grading import check

__all__ = ["check"]
