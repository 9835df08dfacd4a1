"""Reference solution of `ch05.evict`."""


class EvictingAllocator:
    def __init__(self, num_blocks: int):
        self.free_queue = list(range(num_blocks))
        self.evictable: list[int] = []
        self.ref_counts = [0] * num_blocks
        self.cached: set[int] = set()

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_queue) + len(self.evictable):
            raise MemoryError(f"asked for {n} blocks, {len(self.free_queue) + len(self.evictable)} available")
        blocks = []
        for _ in range(n):
            if self.free_queue:
                block = self.free_queue.pop(0)
            else:
                block = self.evictable.pop(0)  # the least recently used cached block
                self.cached.discard(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def cache(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is not held: only computed blocks are cached")
        self.cached.add(block)

    def hit(self, block: int) -> None:
        if block not in self.cached:
            raise ValueError(f"block {block} is not cached")
        if self.ref_counts[block] == 0:
            self.evictable.remove(block)
        self.ref_counts[block] += 1

    def release(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is not held")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            (self.evictable if block in self.cached else self.free_queue).append(block)
