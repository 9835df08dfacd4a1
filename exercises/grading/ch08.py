"""Chapter 8's cases: `ch08.pad` (a decode batch padded to its bucket) and `ch08.fill` (the static
buffers refilled in place)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from exercises.grading.core import call, exercise, expect, expect_raises
from minillm.graphs.buckets import bucket_for
from minillm.graphs.padding import DecodeRow, pad_decode_batch

pad = exercise("ch08.pad", "ch08_pad_batch", "pad_to_bucket")
fill = exercise("ch08.fill", "ch08_fill_buffers", "fill_buffers")
NAMES = ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens")


def _expected(rows, buckets, width, block_size, pad_block) -> dict | None:
    bucket = bucket_for(len(rows), buckets) if rows else buckets[0]
    if bucket is None:
        return None
    batch = pad_decode_batch([DecodeRow(*r) for r in rows], bucket, width, block_size, pad_block)
    return {name: getattr(batch, name) for name in NAMES}


def _pad(impl: Any, rows, buckets, width: int, block_size: int, pad_block: int, why: str,
         only: tuple[str, ...] = NAMES) -> None:
    given = f"pad_to_bucket({rows}, buckets={buckets}, width={width}, block_size={block_size}, pad_block={pad_block})"
    want = _expected(rows, buckets, width, block_size, pad_block)
    copies = [(t, p, list(b)) for t, p, b in rows]
    got = call(given, f"{want} ({why})", impl, rows, list(buckets), width, block_size, pad_block)
    expect(rows == copies, given, "rows left unchanged", repr(rows))
    if want is None:
        expect(got is None, given, f"None ({why})", repr(got))
        return
    expect(isinstance(got, dict), given, f"a dict of lists ({why})", repr(got))
    for name in only:
        value = got.get(name)
        value = [list(v) for v in value] if name == "block_tables" and isinstance(value, list | tuple) else value
        value = list(value) if isinstance(value, tuple) else value
        expect(value == want[name], given, f'"{name}" {want[name]} ({why})', repr(got.get(name)))


@pad.case
def the_smallest_bucket_that_holds_the_rows(impl: Callable) -> None:
    """The batch pads up to the smallest bucket that holds it"""
    rows = [(7, 5, [3, 0]), (8, 1, [4]), (9, 6, [1, 2])]
    _pad(impl, rows, [1, 2, 4, 8], 3, 4, 9, "3 rows: bucket 4", only=("input_ids", "positions"))
    _pad(impl, rows[:2], [1, 2, 4, 8], 3, 4, 9, "2 rows: bucket 2, no padding", only=("input_ids",))
    _pad(impl, rows, [2, 3, 16], 3, 4, 9, "3 rows: bucket 3 exactly", only=("input_ids", "positions"))


@pad.case
def none_above_the_largest_bucket(impl: Callable) -> None:
    """None when the largest bucket is too small (the step runs eagerly)"""
    _pad(impl, [(1, 0, [0])] * 5, [1, 2, 4], 2, 4, 9, "5 rows, largest bucket 4")


@pad.case
def slots_come_from_the_block_table(impl: Callable) -> None:
    """A row's slot is table[position // block_size] * block_size + position % block_size"""
    _pad(impl, [(7, 5, [3, 0]), (8, 9, [4, 6, 2]), (9, 0, [5])], [3], 3, 4, 7,
         "position 5: table[5 // 4] = block 0, offset 1 -> slot 1", only=("slot_mapping",))


@pad.case
def a_rows_context_counts_its_own_token(impl: Callable) -> None:
    """A row's context length is position + 1: the tokens before it and its own"""
    _pad(impl, [(7, 5, [3, 0]), (8, 9, [4, 6, 2]), (9, 0, [5])], [3], 3, 4, 7,
         "position 5 attends to positions 0..5: 6 tokens", only=("context_lens",))


@pad.case
def padding_rows_touch_only_the_pad_block(impl: Callable) -> None:
    """Padding rows read and write only the pad block: slot pad_block * block_size, table of pad_block, context 1"""
    _pad(impl, [(7, 5, [3, 0])], [4, 8], 3, 4, 9, "1 row + 3 padding rows")
    _pad(impl, [], [2, 4], 2, 8, 0, "no rows at all: the smallest bucket, all padding (pad block 0)")


@pad.case
def block_tables_are_padded_to_the_width(impl: Callable) -> None:
    """Every block table is padded with pad_block up to `width` entries"""
    _pad(impl, [(7, 5, [3, 0]), (8, 1, [4])], [2], 4, 4, 9, "width 4", only=("block_tables",))


@pad.case
def random_batches_match_the_engine(impl: Callable) -> None:
    """Random batches, buckets and block sizes: every list as the engine's padding gives it"""
    rng = random.Random(8)
    for _ in range(25):
        block_size, width = rng.choice([1, 4, 16]), rng.randint(1, 5)
        buckets = sorted(rng.sample(range(1, 12), rng.randint(1, 4)))
        pad_block = 100
        rows = []
        for _ in range(rng.randint(1, 12)):
            position = rng.randrange(width * block_size)
            table = rng.sample(range(60), position // block_size + 1)
            rows.append((rng.randrange(256), position, table))
        _pad(impl, rows, buckets, width, block_size, pad_block, "as the engine pads it")


# ----------------------------------------------------------------------------------------------------- fill


def _buffers(rows: int, width: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(rows, dtype=torch.long), "positions": torch.zeros(rows, dtype=torch.long),
            "slot_mapping": torch.zeros(rows, dtype=torch.long), "block_tables": torch.zeros(rows, width,
                                                                                             dtype=torch.int32),
            "context_lens": torch.ones(rows, dtype=torch.int32)}


def _batch(rows: int, width: int, seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    return {"input_ids": [rng.randrange(256) for _ in range(rows)],
            "positions": [rng.randrange(64) for _ in range(rows)],
            "slot_mapping": [rng.randrange(512) for _ in range(rows)],
            "block_tables": [[rng.randrange(32) for _ in range(width)] for _ in range(rows)],
            "context_lens": [rng.randrange(1, 65) for _ in range(rows)]}


@fill.case
def every_buffer_holds_its_lists_values(impl: Callable) -> None:
    """Every buffer holds its list's values afterwards"""
    buffers, batch = _buffers(4, 3), _batch(4, 3, seed=1)
    call("fill_buffers(buffers of 4 rows x 3 blocks, a batch of 4 rows)", "no error", impl, buffers, batch)
    for name in NAMES:
        expect(buffers[name].tolist() == batch[name], f"buffers[{name!r}] after fill_buffers", batch[name],
               buffers[name].tolist())


@fill.case
def the_buffers_stay_the_same_tensors_at_the_same_addresses(impl: Callable) -> None:
    """The buffers stay the same tensors, at the same addresses, with their dtypes and shapes: a replay reads those"""
    buffers = _buffers(4, 3)
    before = {name: (t, t.data_ptr(), t.dtype, tuple(t.shape)) for name, t in buffers.items()}
    for seed in (2, 3):  # twice: the second step must land in the same memory too
        call(f"fill_buffers(buffers, batch {seed})", "no error", impl, buffers, _batch(4, 3, seed))
        for name, (tensor, address, dtype, shape) in before.items():
            now = buffers[name]
            expect(now is tensor and now.data_ptr() == address, f"buffers[{name!r}] after step {seed - 1}",
                   "the same tensor at the same address (a CUDA Graph reads that address)",
                   "a new tensor" if now is not tensor else f"data moved to {now.data_ptr():#x}")
            expect(now.dtype == dtype and tuple(now.shape) == shape, f"buffers[{name!r}]", f"{dtype}, {shape}",
                   f"{now.dtype}, {tuple(now.shape)}")


@fill.case
def a_batch_of_another_shape_is_refused_and_changes_nothing(impl: Callable) -> None:
    """A batch whose shape differs from the buffers' raises ValueError and changes nothing (never broadcast)"""
    for rows, width, what in ((1, 3, "1 row for buffers of 4"), (4, 2, "tables 2 wide for buffers 3 wide"),
                              (8, 3, "8 rows for buffers of 4")):
        buffers = _buffers(4, 3)
        batch = _batch(rows, width, seed=4)
        if rows == 4:  # only the tables are wrong; the other lists fit
            batch = _batch(4, 3, seed=4) | {"block_tables": batch["block_tables"]}
        snapshot = {name: t.clone() for name, t in buffers.items()}
        expect_raises(ValueError, f"fill_buffers(buffers of 4 rows x 3 blocks, a batch of {what})", impl, buffers,
                      batch)
        changed = [name for name in NAMES if not torch.equal(buffers[name], snapshot[name])]
        expect(not changed, f"after the refused batch of {what}", "every buffer unchanged", f"{changed} changed")
