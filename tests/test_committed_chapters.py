"""The chapters are committed as a learner should first see them: every code cell executed, no error,
and measurements taken on a quiet machine — a committed output that carries the busy-machine warning
(minillm/timing.py) would show a learner, before they run anything, numbers the chapter disowns.
`make execute NB=...` on a quiet machine regenerates a chapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((REPO / "chapters").glob("*.ipynb"))
BUSY = "Other work was running"  # the guard's first words (minillm/timing.py::Trials.warning)


def outputs_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts += output.get("text", [])
        parts += output.get("data", {}).get("text/plain", [])
    return "".join(parts)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_is_committed_executed_without_errors_on_a_quiet_machine(chapter: Path):
    cells = [c for c in json.loads(chapter.read_text())["cells"] if c["cell_type"] == "code"]
    unexecuted = [i for i, c in enumerate(cells) if c["execution_count"] is None]
    errors = [i for i, c in enumerate(cells) if any(o["output_type"] == "error" for o in c.get("outputs", []))]
    busy = [i for i, c in enumerate(cells) if BUSY in outputs_text(c)]
    unjoined = [i for i, c in enumerate(cells) if "\r" in outputs_text(c) or any(  # widgets/save_hook.py
        a["output_type"] == b["output_type"] == "stream" and a["name"] == b["name"]
        for a, b in zip(c.get("outputs", []), c.get("outputs", [])[1:]))]
    assert not (unexecuted or errors or busy or unjoined), (
        f"{chapter.name}: code cells (counted from 0) unexecuted {unexecuted}, with an error {errors}, measured on a "
        f"busy machine {busy}, prints not joined as JupyterLab joins them {unjoined}: rerun "
        f"`make execute NB=chapters/{chapter.name}` on a quiet machine")


def test_the_busy_marker_is_the_guards_own_words():
    from minillm.timing import CpuUse, Trials

    busy = Trials({"a": [1.0]}, CpuUse(wall_s=1.0, ours_s=0.2, others_s=1.8, cores=2, threads=2))
    assert BUSY in (busy.warning() or "")
