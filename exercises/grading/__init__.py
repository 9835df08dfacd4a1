"""The exercise graders: `check(name)` in a notebook, `python -m exercises.grading` (make grade) for
the score, and the tests (tests/exercises/) all run these cases.

core.py is the machinery; chNN.py holds chapter NN's cases.
"""

from exercises.grading import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11, ch12, ch13  # noqa: F401  (registers the cases)
from exercises.grading.core import EXERCISES, Result, check, format_score, load, run, score

__all__ = ["EXERCISES", "Result", "check", "format_score", "load", "run", "score"]
