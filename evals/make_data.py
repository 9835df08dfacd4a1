"""Writes the two tasks' questions (`python evals/make_data.py`; the output is committed and stable).

Both tasks draw, with their own seed, from every single-digit addition and subtraction: 100 of each,
`What is a+b?` and `What is a-b?` for a, b in 0..9. The shipped target was trained on the additions
and the 55 subtractions without a negative result (scripts/train_tiny_models.py::arithmetic_facts),
so it answers those, and it has never seen a negative answer: the 45 others are the questions it
gets wrong, and they keep the scores away from both chance and 100%.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
MC_SIZE = 40
GEN_SIZE = 40


def questions() -> list[tuple[str, int]]:
    """All 200 single-digit questions with their answers, additions first."""
    adds = [(f"What is {a}+{b}?", a + b) for a in range(10) for b in range(10)]
    subs = [(f"What is {a}-{b}?", a - b) for a in range(10) for b in range(10)]
    return adds + subs


def choices_for(answer: int, rng: random.Random) -> tuple[list[str], int]:
    """Four choices: the answer, its sign flipped (unless 0), and its nearest neighbours; shuffled."""
    wrong = [-answer] if answer != 0 else []
    for step in (1, -1, 2, -2, 3):
        if len(wrong) == 3:
            break
        wrong.append(answer + step)
    options = [answer] + wrong[:3]
    rng.shuffle(options)
    return [str(x) for x in options], options.index(answer)


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    pool = questions()
    rng = random.Random(1)
    mc = []
    for question, answer in rng.sample(pool, MC_SIZE):
        choices, label = choices_for(answer, rng)
        mc.append({"question": question, "choices": choices, "label": label})
    write(HERE / "arith_mc.jsonl", mc)
    rng = random.Random(2)
    write(HERE / "arith_gen.jsonl", [{"question": q, "answer": str(a)} for q, a in rng.sample(pool, GEN_SIZE)])


if __name__ == "__main__":
    main()
