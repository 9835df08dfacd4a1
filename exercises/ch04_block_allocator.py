"""Chapter 4 exercise `ch04.allocate`: a block allocator with reference counts."""


class BlockAllocator:
    """Hands out fixed-size KV blocks by id (minillm/kv/block_pool.py is the engine's version).

    State you must keep up to date:
      free_queue: list[int]   free block ids; allocate takes from the FRONT, a freed block goes to the BACK
      ref_counts: list[int]   holders per block; 0 means free
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_queue = list(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks from the front of the free queue, each with ref count 1.
        If fewer are free, raise MemoryError and take none."""
        raise NotImplementedError("ch04.allocate: implement allocate")

    def append(self, table: list[int], num_tokens: int) -> list[int]:
        """Grow block table `table` in place until it holds `num_tokens` tokens (block_size per
        block); return the blocks added (often none). A table never shrinks. If the pool cannot
        supply the blocks, raise MemoryError and change nothing."""
        raise NotImplementedError("ch04.allocate: implement append")

    def incref(self, blocks: list[int]) -> None:
        """One more holder for each block (all must be in use; otherwise ValueError)."""
        raise NotImplementedError("ch04.allocate: implement incref")

    def free(self, blocks: list[int]) -> None:
        """One holder fewer for each block, in the order given; a block whose count reaches 0 goes
        to the back of the free queue. Freeing a block whose count is already 0 raises ValueError
        (double free)."""
        raise NotImplementedError("ch04.allocate: implement free")
