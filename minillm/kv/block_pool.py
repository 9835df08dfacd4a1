"""The block pool: bookkeeping of a paged KV cache, in plain integers (no torch here).

KV memory is cut into `num_blocks` blocks of `block_size` tokens. A request holds a *block table*,
the list of its blocks in token order; its blocks need not be adjacent:

    block_size = 4                      logical block:   0    1    2
    request A, 10 tokens:  table [7, 2, 9]   ->  tokens 0-3 | 4-7 | 8-9 (2 of 4 used)
    token t lives in block table[t // 4] at offset t % 4, i.e. in slot  table[t // 4] * 4 + t % 4

Only a request's last block can be partly empty, so at most `block_size - 1` slots per request are
wasted (internal fragmentation), and any free block fits anyone (no external fragmentation).

Blocks carry reference counts so that chapter 5's prefix cache can share them; a block returns to
the free queue when its count drops to zero. Misuse — freeing a free block, an unknown block id or
request — raises instead of corrupting the pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfBlocks(RuntimeError):
    """The pool cannot supply the blocks asked for (the scheduler preempts and retries)."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_queue: deque[int] = deque(range(num_blocks))  # taken from the left, returned on the right
        self.ref_counts = [0] * num_blocks
        self.tables: dict[str, list[int]] = {}  # request id -> its blocks in token order

    # ------------------------------------------------------------------ physical blocks
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def take(self, count: int) -> list[int]:
        """`count` free blocks, each with reference count 1; OutOfBlocks (taking none) if too few."""
        if count > len(self.free_queue):
            raise OutOfBlocks(f"asked for {count} blocks, {len(self.free_queue)} free of {self.num_blocks}")
        blocks = [self.free_queue.popleft() for _ in range(count)]
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks

    def incref(self, blocks: Iterable[int]) -> None:
        """One more holder for blocks that are in use."""
        for block in blocks:
            self._check_in_use(block)
            self.ref_counts[block] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        """One holder fewer; a block nobody holds goes back to the free queue."""
        for block in blocks:
            self._check_in_use(block)
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue.append(block)

    def _check_in_use(self, block: int) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"unknown block {block!r}: ids run from 0 to {self.num_blocks - 1}")
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is free: double free, or a block that was never allocated")

    # ------------------------------------------------------------------ requests' block tables
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, ()))

    def num_missing_blocks(self, request_id: str, num_tokens: int) -> int:
        """Blocks the request must still get so that its table holds `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(self.tables.get(request_id, ())))

    def can_hold(self, request_id: str, num_tokens: int) -> bool:
        return self.num_missing_blocks(request_id, num_tokens) <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """A new block table for a request's first `num_tokens` tokens."""
        if request_id in self.tables:
            raise ValueError(f"request {request_id!r} already has a block table")
        self.tables[request_id] = self.take(self.blocks_for(num_tokens))
        return list(self.tables[request_id])

    def append(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow a request's table until it holds `num_tokens` tokens; returns the new blocks."""
        table = self._table(request_id)
        new = self.take(self.num_missing_blocks(request_id, num_tokens))
        table.extend(new)
        return new

    def free(self, request_id: str) -> None:
        """Release every block of a request (finished, aborted or preempted)."""
        self.decref(self._table(request_id))
        del self.tables[request_id]

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Physical slot of each token position in [start, end)."""
        table, size = self._table(request_id), self.block_size
        if not 0 <= start <= end <= len(table) * size:
            raise ValueError(f"positions [{start}, {end}) are outside the {len(table) * size} slots of "
                             f"request {request_id!r}")
        return [table[p // size] * size + p % size for p in range(start, end)]

    def _table(self, request_id: str) -> list[int]:
        if request_id not in self.tables:
            raise ValueError(f"request {request_id!r} holds no blocks")
        return self.tables[request_id]

    # ------------------------------------------------------------------ invariants
    @property
    def is_idle(self) -> bool:
        """Back to the starting state: every block free, every count zero, no table left."""
        return (not self.tables and len(self.free_queue) == self.num_blocks and not any(self.ref_counts)
                and len(set(self.free_queue)) == self.num_blocks)
