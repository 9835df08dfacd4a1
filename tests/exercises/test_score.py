"""`make grade`'s score table: per chapter, each exercise's passed/total and its first failure."""

from __future__ import annotations

import runpy
import shutil
import sys
from pathlib import Path

import pytest

from exercises.grading import EXERCISES, format_score, score

ROOT = Path(__file__).parents[2]


def test_an_untouched_checkout_is_not_started():
    chapters = score("exercises")
    assert list(chapters) == ["ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08", "ch09", "ch10",
                              "ch11", "ch12", "ch13"]
    rows = [row for rows in chapters.values() for row in rows]
    assert [r.exercise for r in rows] == list(EXERCISES)
    assert all(r.passed == 0 and r.total == len(EXERCISES[r.exercise].cases) and r.note == "not started" for r in rows)
    table = format_score(chapters)
    assert "Chapter 1\n  exercise               passed  first failure\n" in table
    assert "\n  ch01.top_p                0/8  not started\n" in table
    assert table.endswith(f"0/{len(EXERCISES)} exercises complete")


def test_the_solutions_score_full_marks():
    rows = [row for rows in score("solutions").values() for row in rows]
    assert all(r.passed == r.total and r.note == "all passed" for r in rows)
    assert format_score(score("solutions")).endswith(f"{len(EXERCISES)}/{len(EXERCISES)} exercises complete")


@pytest.fixture
def half_done(tmp_path, monkeypatch):
    """A package with a wrong ch02 answer, the ch04.slot_mapping solution, and no other file."""
    package = tmp_path / "half_done"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ch02_slot_utilisation.py").write_text("def slot_utilisation(steps, num_slots):\n    return 0.5\n")
    shutil.copy(ROOT / "solutions" / "ch04_slot_mapping.py", package)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "half_done"
    for module in [m for m in sys.modules if m.startswith("half_done")]:
        del sys.modules[module]


def test_each_row_shows_the_first_failure_shortened(half_done):
    rows = {r.exercise: r for rows in score(half_done).values() for r in rows}
    wrong = rows["ch02.slot_utilisation"]
    assert (wrong.passed, wrong.total) == (0, 4)
    assert wrong.note == ("counts the slots that ran at least one token: expected 0.5833 (7 busy slot-steps of 3 ste…, "
                          "got 0.5")
    assert rows["ch04.slot_mapping"].note == "all passed"
    assert rows["ch01.top_p"].note.startswith("half_done/ch01_top_p.py does not import: ModuleNotFoundError")


def test_python_m_exercises_grading_prints_the_table(half_done, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["exercises.grading", half_done])
    runpy.run_module("exercises.grading", run_name="__main__")
    out = capsys.readouterr().out
    assert "Chapter 4\n  exercise               passed  first failure\n" in out
    assert "  ch04.slot_mapping         6/6  all passed\n" in out
    assert out.rstrip().endswith(f"1/{len(EXERCISES)} exercises complete")
