"""Graded exercises. Each `chNN_topic.py` holds stubs to fill in; `check()` grades an implementation
with the same graders CI runs (tests/exercises/graders.py)."""

from tests.exercises.graders import check

__all__ = ["check"]
