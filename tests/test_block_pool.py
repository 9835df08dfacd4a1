"""The block pool with exact block ids: allocate / append / free, ref counts, slot mapping, misuse."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.kv.block_pool import BlockPool, OutOfBlocks


def test_allocate_append_free_with_exact_ids():
    pool = BlockPool(num_blocks=6, block_size=4)
    assert pool.allocate("a", 5) == [0, 1]  # 5 tokens -> 2 blocks, first in the free queue
    assert pool.allocate("b", 4) == [2]
    assert pool.append("a", 8) == []  # still fits its 2 blocks
    assert pool.append("a", 9) == [3]
    assert pool.block_table("a") == [0, 1, 3] and pool.num_free_blocks == 2
    pool.free("a")
    assert pool.num_free_blocks == 5 and pool.ref_counts == [0, 0, 1, 0, 0, 0]
    # freed blocks go to the back of the queue: the never-used 4 and 5 come first
    assert pool.allocate("c", 12) == [4, 5, 0]
    pool.free("b")
    pool.free("c")
    assert pool.is_idle


def test_ref_counts_keep_shared_blocks_alive():
    pool = BlockPool(num_blocks=3, block_size=2)
    table = pool.allocate("a", 4)
    pool.incref(table[:1])  # a second holder for block 0 (what chapter 5's prefix cache does)
    pool.free("a")
    assert pool.ref_counts == [1, 0, 0] and pool.num_free_blocks == 2 and not pool.is_idle
    pool.decref([0])
    assert pool.is_idle


def test_out_of_blocks_takes_nothing():
    pool = BlockPool(num_blocks=2, block_size=4)
    pool.allocate("a", 4)
    assert not pool.can_hold("a", 13) and pool.num_missing_blocks("a", 13) == 3
    with pytest.raises(OutOfBlocks):
        pool.append("a", 13)
    assert pool.block_table("a") == [0] and pool.num_free_blocks == 1
    with pytest.raises(OutOfBlocks):
        pool.allocate("b", 9)
    assert "b" not in pool.tables
    pool.free("a")


def test_slot_mapping_crosses_block_boundaries():
    pool = BlockPool(num_blocks=8, block_size=4)
    pool.take(5)  # blocks 0-4 taken by someone else
    pool.allocate("a", 10)  # blocks 5, 6, 7
    assert pool.slot_mapping("a", 0, 10) == [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    assert pool.slot_mapping("a", 3, 5) == [23, 24]
    with pytest.raises(ValueError, match="outside"):
        pool.slot_mapping("a", 10, 13)


def test_misuse_raises_clear_errors():
    pool = BlockPool(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="free"):
        pool.decref([0])  # never allocated
    with pytest.raises(ValueError, match="unknown block"):
        pool.decref([7])
    pool.allocate("a", 1)
    with pytest.raises(ValueError, match="already"):
        pool.allocate("a", 1)
    pool.free("a")
    with pytest.raises(ValueError, match="holds no blocks"):
        pool.free("a")  # double free of a request
    with pytest.raises(ValueError, match="free"):
        pool.decref([0])  # double free of a block
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(4, block_size=0)
    assert pool.is_idle


def test_the_pool_module_does_not_use_torch():
    from pathlib import Path

    import minillm.kv.block_pool as module

    source = Path(module.__file__).read_text()
    assert "import torch" not in source and "from torch" not in source


OPS = st.lists(st.tuples(st.sampled_from(["allocate", "append", "free"]), st.integers(0, 5), st.integers(1, 40)),
               max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 4, 16]))
def test_random_operations_keep_the_books_balanced(ops, num_blocks, block_size):
    """Any sequence of allocate / append / free keeps every block either free or held, never both; a
    table's blocks hold exactly its tokens; a refused request takes nothing; freeing all restores the start."""
    pool = BlockPool(num_blocks, block_size)
    tokens: dict[str, int] = {}
    for op, who, n in ops:
        rid = f"r{who}"
        try:
            if op == "allocate" and rid not in tokens:
                pool.allocate(rid, n)
                tokens[rid] = n
            elif op == "append" and rid in tokens:
                pool.append(rid, tokens[rid] + n)
                tokens[rid] += n
            elif op == "free" and rid in tokens:
                pool.free(rid)
                del tokens[rid]
        except OutOfBlocks:
            pass  # refused whole: the books below must still balance
        held = [b for table in pool.tables.values() for b in table]
        assert len(held) == len(set(held)), "a block is in two tables"
        assert set(held).isdisjoint(pool.free_queue), "a block is both free and held"
        assert len(held) + pool.num_free_blocks == num_blocks
        assert all(pool.ref_counts[b] == 1 for b in held) and sum(pool.ref_counts) == len(held)
        for rid, count in tokens.items():
            assert len(pool.block_table(rid)) == pool.blocks_for(count)
    for rid in list(tokens):
        pool.free(rid)
    assert pool.is_idle
