"""The live experiments of the chapters: what a chapter times on the learner's own machine, run
interleaved and repeated (`minillm/timing.py`), with the prose computed from the numbers it
describes and the busy-machine guard beside it. `experiments/chNN.py` holds chapter NN's; the
notebook calls them, and tests/experiments/ runs each under an artificial CPU hog."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from minillm.timing import Trials


@dataclass
class Finding:
    """What an experiment found: its words (computed from its numbers), whether the chapter's claim
    held in them, the numbers themselves, and the rounds they came from."""

    text: str
    holds: bool
    numbers: dict[str, Any]
    trials: Trials | None = None

    @property
    def warning(self) -> str | None:
        return self.trials.warning() if self.trials is not None else None

    def show(self) -> None:
        """Print the words, wrapped to 100 columns — after the guard's warning when it fired, so that
        they read as what a disturbed run showed, not as settled."""
        if self.warning:
            print(textwrap.fill(self.warning, 100) + "\n")
        for paragraph in self.text.split("\n"):
            print(textwrap.fill(paragraph, 100) if paragraph.strip() else "")
