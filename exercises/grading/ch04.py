"""Chapter 4's cases: `ch04.allocate` (the block allocator) and `ch04.slot_mapping`."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from exercises.grading.core import Story, call, exercise, expect, expect_raises

# ----------------------------------------------------------------------------- ch04.allocate

allocate = exercise("ch04.allocate", "ch04_block_allocator", "BlockAllocator")


class _Pool(Story):
    def __init__(self, cls: Any, num_blocks: int, block_size: int):
        super().__init__("BlockAllocator", cls, num_blocks=num_blocks, block_size=block_size)

    def expect_state(self, free_queue: list[int], ref_counts: list[int], why: str) -> None:
        super().expect_state(why, free_queue=free_queue, ref_counts=ref_counts)


@allocate.case
def allocate_takes_blocks_from_the_front_with_ref_count_one(cls: type) -> None:
    pool = _Pool(cls, num_blocks=5, block_size=4)
    pool.do([0, 1], "allocate", 2)
    pool.do([2], "allocate", 1)
    pool.expect_state([3, 4], [1, 1, 1, 0, 0], "blocks 0-2 taken from the front, one holder each")
    pool.do(None, "free", [0])
    pool.do([3, 4], "allocate", 2)


@allocate.case
def allocate_can_take_the_last_free_blocks(cls: type) -> None:
    pool = _Pool(cls, num_blocks=3, block_size=4)
    pool.do([0, 1, 2], "allocate", 3)
    pool.expect_state([], [1, 1, 1], "3 blocks asked, 3 free")


@allocate.case
def allocate_that_runs_out_raises_memory_error_and_takes_nothing(cls: type) -> None:
    pool = _Pool(cls, num_blocks=3, block_size=4)
    pool.do([0, 1], "allocate", 2)
    pool.fails(MemoryError, "allocate", 2)
    pool.expect_state([2], [1, 1, 0], "a failed allocate takes no block")


@allocate.case
def append_adds_a_block_only_when_the_tokens_cross_a_block_boundary(cls: type) -> None:
    pool = _Pool(cls, num_blocks=8, block_size=4)
    table = pool.do([0], "allocate", 1)  # holds tokens 0-3
    for num_tokens, new in [(4, []), (5, [1]), (8, []), (12, [2]), (13, [3])]:
        pool.do(new, "append", table, num_tokens)
    pool.do([], "append", [], 0)
    pool.do([4], "append", [], 1)


@allocate.case
def append_grows_the_table_in_place_and_returns_only_the_new_blocks(cls: type) -> None:
    pool = _Pool(cls, num_blocks=6, block_size=4)
    table = pool.do([0, 1], "allocate", 2)
    pool.do([2, 3], "append", table, 14)
    expect(table == [0, 1, 2, 3], f"after {pool.story}", "the table grown in place to [0, 1, 2, 3]", table)
    pool.expect_state([4, 5], [1, 1, 1, 1, 0, 0], "appended blocks have one holder")


@allocate.case
def append_never_shrinks_a_table(cls: type) -> None:
    pool = _Pool(cls, num_blocks=5, block_size=4)
    table = pool.do([0, 1, 2], "allocate", 3)
    pool.do([], "append", table, 5)
    expect(table == [0, 1, 2], f"after {pool.story}", "the table unchanged [0, 1, 2]", table)
    pool.expect_state([3, 4], [1, 1, 1, 0, 0], "5 tokens need no new block")


@allocate.case
def append_that_runs_out_raises_memory_error_and_changes_nothing(cls: type) -> None:
    pool = _Pool(cls, num_blocks=4, block_size=4)
    table = pool.do([0, 1], "allocate", 2)
    pool.fails(MemoryError, "append", table, 20)
    expect(table == [0, 1], f"after {pool.story}", "the table unchanged [0, 1] (20 tokens need 3 more blocks, 2 "
           "are free)", table)
    pool.expect_state([2, 3], [1, 1, 0, 0], "a failed append takes no block")


@allocate.case
def free_returns_blocks_to_the_back_of_the_queue_in_order(cls: type) -> None:
    pool = _Pool(cls, num_blocks=5, block_size=4)
    pool.do([0, 1, 2], "allocate", 3)
    pool.do(None, "free", [2, 0])
    pool.expect_state([3, 4, 2, 0], [0, 1, 0, 0, 0], "2 then 0 go to the back, in the order given")
    pool.do(None, "free", [1])
    pool.expect_state([3, 4, 2, 0, 1], [0, 0, 0, 0, 0], "1 goes to the back")


@allocate.case
def a_shared_block_returns_only_when_its_last_holder_frees_it(cls: type) -> None:
    pool = _Pool(cls, num_blocks=4, block_size=4)
    pool.do([0, 1], "allocate", 2)
    pool.do(None, "incref", [0])
    pool.expect_state([2, 3], [2, 1, 0, 0], "block 0 has a second holder")
    pool.do(None, "free", [0, 1])
    pool.expect_state([2, 3, 1], [1, 0, 0, 0], "block 0 is still held once; block 1 is free")
    pool.do(None, "free", [0])
    pool.expect_state([2, 3, 1, 0], [0, 0, 0, 0], "block 0's last holder let go")


@allocate.case
def freeing_a_free_block_raises_value_error(cls: type) -> None:
    pool = _Pool(cls, num_blocks=3, block_size=4)
    pool.do([0], "allocate", 1)
    pool.do(None, "free", [0])
    pool.fails(ValueError, "free", [0])
    pool.fails(ValueError, "free", [2])
    pool.expect_state([1, 2, 0], [0, 0, 0], "a double free changes nothing")


@allocate.case
def incref_of_a_free_block_raises_value_error(cls: type) -> None:
    pool = _Pool(cls, num_blocks=3, block_size=4)
    pool.do([0], "allocate", 1)
    pool.fails(ValueError, "incref", [1])
    pool.expect_state([1, 2], [1, 0, 0], "a free block cannot gain a holder")


@allocate.case
def matches_the_engine_block_pool_on_random_operations(cls: type) -> None:
    from minillm.kv.block_pool import BlockPool, OutOfBlocks

    rng = random.Random(4)
    for _ in range(20):
        n = rng.randint(1, 8)
        engine, pool = BlockPool(n, 4), _Pool(cls, n, 4)
        for _ in range(15):
            held = [b for b in range(n) if engine.ref_counts[b]]
            op = rng.choice(["allocate", "incref", "free"]) if held else "allocate"
            if op == "allocate":
                k = rng.randint(1, 3)
                try:
                    pool.do(engine.take(k), "allocate", k)
                except OutOfBlocks:
                    pool.fails(MemoryError, "allocate", k)
            else:
                blocks = rng.sample(held, rng.randint(1, len(held)))
                (engine.incref if op == "incref" else engine.decref)(blocks)
                pool.do(None, op, blocks)
            pool.expect_state(list(engine.free_queue), list(engine.ref_counts), "as minillm's BlockPool")


# ----------------------------------------------------------------------------- ch04.slot_mapping

slot_mapping = exercise("ch04.slot_mapping", "ch04_slot_mapping", "slot_mapping")


def _map(fn: Any, table: list[int], block_size: int, start: int, end: int, want: list[int], why: str) -> None:
    given = f"slot_mapping({table}, block_size={block_size}, start={start}, end={end})"
    got = call(given, f"{want} ({why})", fn, list(table), block_size, start, end)
    expect(isinstance(got, list) and got == want, given, f"{want} ({why})", repr(got))


@slot_mapping.case
def maps_each_token_through_the_block_table(fn: Callable) -> None:
    _map(fn, [7, 2, 9], 4, 0, 10, [28, 29, 30, 31, 8, 9, 10, 11, 36, 37],
         "token t: block = block_table[t // 4], slot = block * 4 + t % 4")


@slot_mapping.case
def a_window_starts_anywhere_in_the_table(fn: Callable) -> None:
    _map(fn, [3, 0], 16, 15, 17, [63, 0], "tokens 15 and 16 straddle blocks 3 and 0")
    _map(fn, [7, 2, 9], 4, 5, 9, [9, 10, 11, 36], "tokens 5-8")


@slot_mapping.case
def an_empty_range_maps_to_no_slots(fn: Callable) -> None:
    _map(fn, [5], 8, 4, 4, [], "start == end")


@slot_mapping.case
def a_range_that_exactly_fills_the_table_is_fine(fn: Callable) -> None:
    _map(fn, [1, 2], 4, 0, 8, [4, 5, 6, 7, 8, 9, 10, 11], "2 blocks of 4 hold tokens 0-7")


@slot_mapping.case
def positions_past_the_table_raise_value_error(fn: Callable) -> None:
    for start, end in [(6, 9), (0, 9), (8, 10)]:
        expect_raises(ValueError, f"slot_mapping([1, 2], block_size=4, start={start}, end={end}): the 2 blocks hold "
                      f"tokens 0-7", fn, [1, 2], 4, start, end)


@slot_mapping.case
def agrees_with_the_engine_block_pool(fn: Callable) -> None:
    from minillm.kv.block_pool import BlockPool

    pool = BlockPool(num_blocks=12, block_size=8)
    pool.take(3)
    pool.allocate("x", 30)
    for start, end in [(0, 30), (7, 9), (16, 24), (30, 32)]:
        _map(fn, pool.block_table("x"), 8, start, end, pool.slot_mapping("x", start, end), "minillm's BlockPool")
