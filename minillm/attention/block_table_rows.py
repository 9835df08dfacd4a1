"""The block tables of a paged cache as rows of one tensor, kept from step to step.

A step's sequences arrive with their block tables as Python tuples (the block pool's books).
Turning every table into a tensor every step costs time in proportion to all the blocks of all the
running sequences — ~1 ms at 64 sequences of 2,048 tokens — although a table changes only when its
sequence crosses a block boundary, or when the row goes to another sequence. So each row keeps
what it holds, and a step writes only what changed: usually nothing, or the new last block.

    row 3 holds (12, 40, 7)        the step brings (12, 40, 7, 51)  -> writes 51 at column 3
    row 5 holds (9, 9, 30)         the step brings (2, 8)           -> rewrites the row (another sequence)

Rows are the sequences' batch slots (they keep their slot while they run); entries past a row's
length are stale ids of earlier sequences, never read (reads stop at each context's length) and
always valid block ids, so even the torch reference's padded gather stays in range.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class BlockTableRows:
    def __init__(self, num_blocks: int, device: torch.device | str):
        self.num_blocks = num_blocks
        self.tensor = torch.zeros((0, 0), dtype=torch.int32, device=device)  # (rows, width)
        self.held: list[tuple[int, ...]] = []  # per row: the table it holds
        self.last_written = 0  # entries the last sync wrote

    def sync(self, rows: Sequence[int], tables: Sequence[Sequence[int]]) -> None:
        """Make row rows[i] hold tables[i], writing only entries that differ from what it held."""
        self._grow(max(rows) + 1, max(len(t) for t in tables))
        changed, firsts, counts, values = [], [], [], []  # per row written: where it starts, how many
        for row, table in zip(rows, tables):
            table, held = tuple(table), self.held[row]
            if table == held:
                continue
            n = len(held)
            if n <= len(table) and table[:n] == held:  # grown: only the new blocks
                first = n
            elif len(table) < n and held[: len(table)] == table:  # shrunk (refused guesses): nothing to write
                first = len(table)
            else:
                first = 0
            new = table[first:]
            if new and (min(new) < 0 or max(new) >= self.num_blocks):
                raise ValueError(f"block table {list(table)} has ids outside [0, {self.num_blocks})")
            changed.append(row)
            firsts.append(first)
            counts.append(len(new))
            values += new
            self.held[row] = table
        self.last_written = len(values)
        if values:  # one indexed write for the whole step, its indices built by tensor ops
            device = self.tensor.device
            count = torch.tensor(counts, device=device)
            row_index = torch.repeat_interleave(torch.tensor(changed, device=device), count)
            column_index = torch.arange(len(values), device=device) + torch.repeat_interleave(
                torch.tensor(firsts, device=device) - (torch.cumsum(count, 0) - count), count)
            self.tensor[row_index, column_index] = torch.tensor(values, dtype=torch.int32, device=device)

    def gather(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """(len(rows), width) int32: the first `width` entries of the given rows."""
        return self.tensor[rows, :width]

    def _grow(self, num_rows: int, width: int) -> None:
        rows, columns = self.tensor.shape
        if num_rows <= rows and width <= columns:
            return
        grown = torch.zeros((max(num_rows, rows), max(width, columns)), dtype=torch.int32, device=self.tensor.device)
        grown[:rows, :columns] = self.tensor
        self.tensor = grown
        self.held += [()] * (grown.shape[0] - rows)
