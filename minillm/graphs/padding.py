"""A decode batch padded up to its bucket: the plain lists a recorded step's buffers are filled from.

A recorded step (a CUDA Graph, a compiled step) has fixed shapes: it always runs `bucket` rows and
reads block tables `width` blocks wide. A step with fewer decodes fills the rest with padding rows
that write their K/V only into the *pad block* — one block the cache keeps aside, owned by no
request — and read only it back; their outputs are dropped.

    3 decodes, bucket 4, block_size 4, width 3, pad block P
    row  input  position  slot (where its K/V go)    block table   context
    0    a      9         table_a[2] * 4 + 1         a0 a1 a2      10
    1    b      2         table_b[0] * 4 + 2         b0 P  P       3      <- tables padded with P
    2    c      5         table_c[1] * 4 + 1         c0 c1 P       6
    3    0      0         P * 4 + 0                  P  P  P       1      <- padding: only block P
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeRow:
    """One decoding request in a step: its newest token, that token's position, and its blocks
    (enough for position + 1 tokens)."""

    token_id: int
    position: int
    block_table: Sequence[int]


@dataclass(frozen=True)
class PaddedDecodeBatch:
    """`bucket` rows of everything a recorded decode step reads; rows `num_real`... are padding."""

    input_ids: list[int]  # (bucket,)
    positions: list[int]  # (bucket,)
    slot_mapping: list[int]  # (bucket,) where each row writes its K/V: block * block_size + offset
    block_tables: list[list[int]]  # (bucket, width) each row's blocks, then the pad block
    context_lens: list[int]  # (bucket,) tokens each row attends to, its own included
    num_real: int


def pad_decode_batch(rows: Sequence[DecodeRow], bucket: int, width: int, block_size: int,
                     pad_block: int) -> PaddedDecodeBatch:
    """The rows, then `bucket - len(rows)` padding rows that touch only `pad_block`. Raises
    ValueError if the rows do not fit the bucket or the width, or a row's table names the pad block."""
    if len(rows) > bucket:
        raise ValueError(f"{len(rows)} rows do not fit a bucket of {bucket}")
    input_ids, positions, slots, tables, context_lens = [], [], [], [], []
    for row in rows:
        table, block_index = list(row.block_table), row.position // block_size
        if not block_index < len(table) <= width:
            raise ValueError(f"a row at position {row.position} needs more than {block_index} blocks and at most "
                             f"{width} (the recorded width), got a table of {len(table)}")
        if pad_block in table:
            raise ValueError(f"block {pad_block} is the pad block: no request may own it")
        input_ids.append(row.token_id)
        positions.append(row.position)
        slots.append(table[block_index] * block_size + row.position % block_size)
        tables.append(table + [pad_block] * (width - len(table)))
        context_lens.append(row.position + 1)
    padding = bucket - len(rows)
    return PaddedDecodeBatch(input_ids + [0] * padding, positions + [0] * padding,
                             slots + [pad_block * block_size] * padding,
                             tables + [[pad_block] * width for _ in range(padding)],
                             context_lens + [1] * padding, len(rows))
