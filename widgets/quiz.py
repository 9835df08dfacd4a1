"""Multiple-choice questions whose answers and explanations open on click — plain HTML
`<details>`, so they work in a notebook rendered without a kernel too."""

from __future__ import annotations

import html
from dataclasses import dataclass

from IPython.display import HTML


@dataclass(frozen=True)
class Question:
    prompt: str
    options: tuple[str, ...]
    answer: int  # index into options
    explanation: str

    def __post_init__(self) -> None:
        if not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer must index options (0..{len(self.options) - 1}), got {self.answer}")


def render_quiz(questions: list[Question]) -> str:
    parts = []
    for n, q in enumerate(questions, 1):
        options = "".join(f"<li>{html.escape(o)}</li>" for o in q.options)
        parts.append(
            f"<div class='quiz-question'><p><b>Q{n}.</b> {html.escape(q.prompt)}</p>"
            f"<ol type='A'>{options}</ol>"
            f"<details><summary>Show the answer</summary><p><b>{'ABCDEFG'[q.answer]}.</b> "
            f"{html.escape(q.explanation)}</p></details></div>"
        )
    return "".join(parts)


def quiz(questions: list[Question]) -> HTML:
    return HTML(render_quiz(questions))
