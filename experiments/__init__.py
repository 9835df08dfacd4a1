"""The live experiments of the chapters: what a chapter times on the learner's own machine, run
interleaved and repeated (`minillm/timing.py`), with the prose computed from the numbers it
describes and the busy-machine guard beside it. `experiments/chNN.py` holds chapter NN's; the
notebook calls them, and tests/experiments/ runs each under an artificial CPU hog."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
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


class NeedsEarlierCells(NameError):
    """A cell run on its own, in a kernel where the cells it builds on have not run (a reopened notebook)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead of a traceback
        return [f"⚠ {self}"]


def needs(names: dict[str, Any], *wanted: str, made_in: str) -> None:
    """Stop a cell at once, with what to do, when the names it uses (from `globals()`) are not made yet —
    rather than a NameError halfway through it."""
    missing = [name for name in wanted if name not in names]
    if missing:
        listed = ", ".join(f"`{name}`" for name in missing)
        raise NeedsEarlierCells(f"This cell uses {listed}, made in {made_in}, which has not run in this kernel. "
                                "Run the cells above it first (Run ▸ Run All Above Selected Cell), then this one.")


def outputs_tokens(run: Any) -> list[list[int]]:
    """The tokens of every request of a run that has `outputs` (the engine's `RequestOutput`s)."""
    return [list(o.token_ids) for o in run.outputs]


def same_tokens(trials: Trials, change: str, tokens_of: Callable[[Any], Any] = outputs_tokens) -> Any:
    """Assert every run of every configuration produced the same tokens — a timing comparison means
    something only between runs that did the same work — and return them. `change` names what is
    compared, for the failure: "the prefix cache" → "the prefix cache changed a token"."""
    runs = trials.all_runs()
    tokens = tokens_of(runs[0])
    assert all(tokens_of(run) == tokens for run in runs), f"{change} changed a token"
    return tokens
