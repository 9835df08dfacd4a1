"""Chapter 5 exercise `ch05.evict`: a block allocator that keeps released cached blocks until it
needs their memory, and then evicts the least recently used."""


class EvictingAllocator:
    """minillm/kv/block_pool.py::BlockPool with a prefix cache is the engine's version.

    State you must keep up to date (the grader reads it after every call):
      free_queue: list[int]   blocks holding nothing worth keeping; taken from the FRONT, returned to the BACK
      evictable:  list[int]   cached blocks nobody holds, least recently used FIRST (the next to evict)
      ref_counts: list[int]   holders per block
      cached:     set[int]    blocks whose contents a lookup can find
    """

    def __init__(self, num_blocks: int):
        self.free_queue = list(range(num_blocks))
        self.evictable: list[int] = []
        self.ref_counts = [0] * num_blocks
        self.cached: set[int] = set()

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks, each with ref count 1: from the front of the free queue while it has
        blocks, then by evicting the front of `evictable` (an evicted block is no longer cached).
        If fewer than n are available in total, raise MemoryError and change nothing."""
        raise NotImplementedError("ch05.evict: implement allocate")

    def cache(self, block: int) -> None:
        """A held block's contents became findable (its tokens were computed). ValueError if nobody
        holds it."""
        raise NotImplementedError("ch05.evict: implement cache")

    def hit(self, block: int) -> None:
        """A lookup found cached `block` for a new request: one more holder. An evictable block
        leaves `evictable`. ValueError if the block is not cached."""
        raise NotImplementedError("ch05.evict: implement hit")

    def release(self, block: int) -> None:
        """One holder fewer. When nobody holds it any more: a cached block goes to the BACK of
        `evictable` (the most recently used), any other block to the back of the free queue.
        ValueError if nobody held it."""
        raise NotImplementedError("ch05.evict: implement release")
