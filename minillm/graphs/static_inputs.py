"""The static input buffers of one bucket: allocated once, refilled in place before every replay.

A CUDA Graph records the *addresses* its kernels read. Replaying it reads whatever those addresses
hold now, so a step's inputs must be copied into the very tensors the capture saw — never into new
ones. (A compiled step does not need this, but it runs from the same buffers: one path for both.)

    bucket 4, width W           dtype    filled from PaddedDecodeBatch
    input_ids     (4,)          int64    input_ids
    positions     (4,)          int64    positions
    slot_mapping  (4,)          int64    slot_mapping
    block_tables  (4, W)        int32    block_tables
    context_lens  (4,)          int32    context_lens
"""

from __future__ import annotations

import torch

from minillm.graphs.padding import PaddedDecodeBatch


class StaticDecodeInputs:
    """Everything a recorded decode step of `batch_size` rows reads, starting as padding rows."""

    def __init__(self, batch_size: int, width: int, block_size: int, pad_block: int,
                 device: torch.device | str = "cpu"):
        self.batch_size, self.width = batch_size, width
        self.input_ids = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((batch_size,), pad_block * block_size, dtype=torch.long, device=device)
        self.block_tables = torch.full((batch_size, width), pad_block, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(batch_size, dtype=torch.int32, device=device)

    def fill(self, batch: PaddedDecodeBatch) -> None:
        """Copy a padded batch into the buffers, in place (their addresses never change). Its block
        tables may be narrower than the buffer: they fill its first columns, and the columns after
        them keep old block ids that no context length reaches."""
        used = len(batch.block_tables[0]) if batch.block_tables else 0
        if len(batch.input_ids) != self.batch_size or any(len(t) != used for t in batch.block_tables) \
                or used > self.width:
            raise ValueError(f"the buffers hold {self.batch_size} rows x {self.width} blocks, got "
                             f"{len(batch.input_ids)} rows x {used}")
        tables = self.block_tables[:, :used]
        for buffer, values in ((self.input_ids, batch.input_ids), (self.positions, batch.positions),
                               (self.slot_mapping, batch.slot_mapping), (tables, batch.block_tables),
                               (self.context_lens, batch.context_lens)):
            buffer.copy_(torch.tensor(values, dtype=buffer.dtype))  # host list -> the same memory

    def first_rows(self, batch_size: int) -> StaticDecodeInputs:
        """A smaller bucket's buffers as views of this one's first rows: every bucket shares one memory."""
        if not 1 <= batch_size <= self.batch_size:
            raise ValueError(f"a view of 1..{self.batch_size} rows, got {batch_size}")
        view = object.__new__(StaticDecodeInputs)
        view.batch_size, view.width = batch_size, self.width
        for name in ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens"):
            setattr(view, name, getattr(self, name)[:batch_size])
        return view

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """(input_ids, positions, slot_mapping, block_tables, context_lens), the step's arguments."""
        return self.input_ids, self.positions, self.slot_mapping, self.block_tables, self.context_lens
