"""The paged cache's block tables kept as tensor rows between passes (minillm/attention/block_table_rows.py):
after every sync each sequence's row holds exactly its table, whatever happened to the rows before,
and a pass writes only what changed."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention.block_table_rows import BlockTableRows
from minillm.attention.paged import PagedKVCache

tables_strategy = st.lists(st.integers(0, 49), min_size=1, max_size=12).map(tuple)
steps_strategy = st.lists(st.dictionaries(st.integers(0, 7), tables_strategy, min_size=1, max_size=6),
                          min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(steps=steps_strategy)
def test_every_row_holds_its_sequences_table_after_any_history(steps):
    kept = BlockTableRows(50, "cpu")
    for step in steps:
        rows, tables = list(step), list(step.values())
        kept.sync(rows, tables)
        for row, table in step.items():
            assert kept.tensor[row, : len(table)].tolist() == list(table)
        assert kept.gather(torch.tensor(rows), max(map(len, tables))).shape == (len(rows), max(map(len, tables)))


def test_a_pass_writes_only_what_changed():
    kept = BlockTableRows(100, "cpu")
    kept.sync([0, 1], [(1, 2, 3), (4, 5)])
    assert kept.last_written == 5
    kept.sync([0, 1], [(1, 2, 3), (4, 5)])  # a decode step inside the blocks: nothing to write
    assert kept.last_written == 0
    kept.sync([1, 0], [(4, 5, 6), (1, 2, 3)])  # one sequence crossed a block boundary
    assert kept.last_written == 1
    kept.sync([1], [(4, 5)])  # refused guesses gave a block back
    assert kept.last_written == 0 and kept.tensor[1, :2].tolist() == [4, 5]
    kept.sync([1], [(9, 5, 6)])  # copy-on-write replaced its first block: the row is written again
    assert kept.last_written == 3 and kept.tensor[1, :3].tolist() == [9, 5, 6]


def test_out_of_range_ids_and_repeated_rows_are_refused():
    kept = BlockTableRows(10, "cpu")
    with pytest.raises(ValueError, match=r"ids outside \[0, 10\)"):
        kept.sync([0], [(3, 10)])
    cache = PagedKVCache(1, 10, 4, 1, 8)
    with pytest.raises(ValueError, match="one distinct row per sequence"):
        cache.batch([(1,), (2,)], [0, 0], [1, 1], rows=[3, 3])


def test_slot_mapping_and_tables_read_the_kept_rows():
    cache = PagedKVCache(1, 20, 4, 1, 8)
    batch = cache.batch([(7, 3), (5,)], [5, 0], [2, 3], rows=[4, 1])  # positions 5, 6 and 0, 1, 2
    assert batch.positions.tolist() == [5, 6, 0, 1, 2]
    assert batch.slot_mapping.tolist() == [3 * 4 + 1, 3 * 4 + 2, 5 * 4, 5 * 4 + 1, 5 * 4 + 2]
    assert batch.prefill_tables.tolist() == [[7, 3], [5, 0]]  # padded past a row's length: never read
    batch = cache.batch([(5, 8), (7, 3)], [4, 6], [1, 1], rows=[1, 4])
    assert batch.decode_groups[0][1].tolist() == [[5, 8], [7, 3]]
    assert batch.slot_mapping.tolist() == [8 * 4, 3 * 4 + 2]
