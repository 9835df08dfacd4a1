"""Chapter 5 exercise `ch05.copy_on_write`: n samples of one prompt share its blocks; the first
write into a block someone else also holds copies it.

`allocate` and `free` are written for you; you write `fork` and `prepare_write`.
(minillm/kv/block_pool.py::BlockPool.fork and BlockPool.prepare_write are the engine's versions.)

State you must keep up to date (the grader reads it after every call):
  free_queue: list[int]              free block ids; blocks are taken from the FRONT, freed ones go to the BACK
  ref_counts: list[int]              holders per block (0: free)
  tables:     dict[str, list[int]]   each sequence's block table: its blocks in token order

    block_size 4, A holds 10 tokens: A [0, 1, 2]    (block 2 holds tokens 8 and 9; two slots still empty)
    fork("A", "B")                 -> B [0, 1, 2], every count 2, no block taken
    prepare_write("A", 10, 11)     -> [(2, 3)]: A [0, 1, 3], block 2 has one holder left (B)
    prepare_write("B", 10, 11)     -> []: B is block 2's last holder and writes in place
"""


class ForkingAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_queue = list(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ given
    def allocate(self, seq: str, num_tokens: int) -> list[int]:
        """A new table for `seq`: ceil(num_tokens / block_size) blocks from the front of the free
        queue, each with ref count 1. Returns a copy of the table. MemoryError (nothing taken) if
        too few are free; ValueError if `seq` already has a table."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has a block table")
        count = -(-num_tokens // self.block_size)
        if count > len(self.free_queue):
            raise MemoryError(f"{num_tokens} tokens need {count} blocks, {len(self.free_queue)} free")
        table = [self.free_queue.pop(0) for _ in range(count)]
        for block in table:
            self.ref_counts[block] = 1
        self.tables[seq] = table
        return list(table)

    def free(self, seq: str) -> None:
        """`seq` is done: one holder fewer for each of its blocks, in table order; a block nobody
        holds any more goes to the back of the free queue. ValueError if `seq` has no table."""
        if seq not in self.tables:
            raise ValueError(f"sequence {seq!r} holds no blocks")
        for block in self.tables.pop(seq):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue.append(block)

    # ------------------------------------------------------------------ yours
    def fork(self, parent: str, child: str) -> list[int]:
        """A new sequence `child` that shares every block of `parent`: its table is a list of its own
        with the same block ids, and each of those blocks gets one more holder. No block is taken
        and nothing is copied. Returns a copy of the child's table.
        ValueError (changing nothing) if `parent` has no table or `child` already has one."""
        raise NotImplementedError("ch05.copy_on_write: implement fork")

    def prepare_write(self, seq: str, start: int, end: int) -> list[tuple[int, int]]:
        """`seq` is about to write the K/V of its token positions start .. end-1 (0 <= start < end).
        1. Grow its table until it holds `end` tokens: new blocks from the front of the free queue,
           ref count 1, appended at the end of the table.
        2. Then, in table order, for each block the positions touch (table indices
           start // block_size .. (end - 1) // block_size): if another sequence holds it too (ref
           count > 1), take a fresh block from the front of the free queue (ref count 1), put it in
           the table in the shared block's place, and let go of the shared block (its count - 1).
           A block held by `seq` alone is written in place.
        Returns the (shared block, its copy) pairs, in table order: [] when nothing was copied.
        MemoryError (changing nothing) if the free queue cannot supply every block of steps 1 and 2;
        ValueError (changing nothing) if `seq` has no table."""
        raise NotImplementedError("ch05.copy_on_write: implement prepare_write")
