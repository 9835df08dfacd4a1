"""Multiple-choice questions that answer back when an option is clicked.

Each option is an HTML `<details>` element: clicking "B. …" opens it and shows right or wrong with
the explanation. Plain HTML, no JavaScript and no kernel, so a quiz works the same in JupyterLab
before anything has run, in a notebook opened read-only, and on a code host's notebook viewer.

    quiz([Question("Where does the first token come from?",
                   ("An extra decode step", "The prefill's last logits"), answer=1,
                   explanation="Prefill already computes the last position's logits.")])

A chapter's questions live in `quizzes/chNN.py` (a list `QUESTIONS`), not in the notebook, so the
answers are not in view above the options; the notebook calls `show_quiz("chNN")`.
"""

from __future__ import annotations

import html
import importlib
import re
from dataclasses import dataclass

from IPython.display import HTML

LETTERS = "ABCDEFGH"
RIGHT, WRONG = "#1a7f37", "#b42318"  # green and red that read on light and dark themes


@dataclass(frozen=True)
class Question:
    prompt: str
    options: tuple[str, ...]
    answer: int  # index into options
    explanation: str  # why the answer is right (shown with it)
    why_not: tuple[str | None, ...] = ()  # optional, per option: why that wrong option is wrong

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        object.__setattr__(self, "why_not", tuple(self.why_not))
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"a question needs 2 to {len(LETTERS)} options, got {len(self.options)}")
        if not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer must index options (0..{len(self.options) - 1}), got {self.answer}")
        if self.why_not and len(self.why_not) != len(self.options):
            raise ValueError(f"why_not needs one entry per option ({len(self.options)}), got {len(self.why_not)}")


def as_html(text: str) -> str:
    """Escaped text, with `code` in backticks shown as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def render_option(question: Question, index: int) -> str:
    """One clickable option: its letter and text, and the verdict it reveals."""
    letter, text = LETTERS[index], as_html(question.options[index])
    if index == question.answer:
        verdict = f"<b style='color:{RIGHT}'>✓ Right.</b> {as_html(question.explanation)}"
    else:
        hint = question.why_not[index] if question.why_not else None
        verdict = f"<b style='color:{WRONG}'>✗ Not this one.</b> " + as_html(hint or "Try another option.")
    return (f"<details class='quiz-option' data-correct='{str(index == question.answer).lower()}'>"
            f"<summary style='cursor:pointer'><b>{letter}.</b> {text}</summary>"
            f"<p style='margin:0.2em 0 0.6em 1.6em'>{verdict}</p></details>")


def render_quiz(questions: list[Question]) -> str:
    """The quiz as HTML: a numbered question, then its lettered options."""
    parts = ["<div class='quiz'><p><i>Click an option to check it.</i></p>"]
    for n, question in enumerate(questions, 1):
        options = "".join(render_option(question, i) for i in range(len(question.options)))
        parts.append(f"<div class='quiz-question' style='margin-bottom:1em'>"
                     f"<p><b>Q{n}.</b> {as_html(question.prompt)}</p>{options}</div>")
    parts.append("</div>")
    return "".join(parts)


def quiz(questions: list[Question]) -> HTML:
    return HTML(render_quiz(questions))


def load_questions(chapter: str) -> list[Question]:
    """`QUESTIONS` of quizzes/<chapter>.py, read afresh (an edited quiz shows without a kernel restart)."""
    if not re.fullmatch(r"ch\d\d", chapter):
        raise ValueError(f"a chapter is named like 'ch05', got {chapter!r}")
    module = importlib.reload(importlib.import_module(f"quizzes.{chapter}"))
    return list(module.QUESTIONS)


def show_quiz(chapter: str) -> HTML:
    """The quiz of one chapter ("ch05"), clickable."""
    return quiz(load_questions(chapter))
