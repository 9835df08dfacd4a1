"""One step's bitmask over the vocabulary: a row per sampling row, filled from each row's matcher.

    sampling rows:  A (decode)      B: last, d1, d2 (verifying 2 guesses)      C (no constraint)
    bitmask rows:   A's matcher     B now | B after d1 | B after d1 d2         (not masked)

A row that verifies guesses must be masked as if the guesses before it had been kept, so the
matcher accepts them one by one while filling, then rolls back: the real tokens come later, after
the acceptance rule. A guess the grammar refuses leaves the rows after it all-allowed — the rule
stops at that guess anyway, since its own row's mask gives it no chance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class StepMasks:
    def __init__(self, num_rows: int, vocab_size: int):
        from minillm.structured.grammars import allocate_bitmask

        self.bitmask = allocate_bitmask(num_rows, vocab_size)  # (num_rows, ceil(vocab / 32)) int32, all allowed
        self.rows: list[int] = []  # the rows that carry a mask

    def fill(self, row: int, matcher, guesses: Sequence[int] = ()) -> None:
        """Row `row` from the matcher as it is, and with guesses rows row + 1 … row + len(guesses),
        each after the guesses before it."""
        matcher.fill(self.bitmask, row)
        self.rows.append(row)
        accepted = 0
        try:
            for j, guess in enumerate(guesses, start=1):
                if not matcher.accept(guess):
                    break
                accepted += 1
                if matcher.is_finished:  # an end-of-sequence guess: nothing can follow it
                    break
                matcher.fill(self.bitmask, row + j)
                self.rows.append(row + j)
        finally:  # whatever happens: a matcher left past guesses the request never kept would mask what follows
            if accepted:  # as if they had been — and let through an output that breaks its grammar
                matcher.rollback(accepted)

    def dead_rows(self) -> list[int]:
        """The masked rows that allow no token at all: a grammar the vocabulary cannot continue."""
        if not self.rows:
            return []
        empty = (self.bitmask[self.rows] == 0).all(dim=-1).tolist()
        return [row for row, none in zip(self.rows, empty) if none]

    def apply(self, logits: torch.Tensor) -> None:
        """Set the refused tokens of the masked rows to -inf, in place. logits: (num_rows, vocab)."""
        if self.rows:
            from minillm.structured.grammars import apply_bitmask

            apply_bitmask(logits, self.bitmask, self.rows)
