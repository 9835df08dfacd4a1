"""Solution of `ch04.allocate`."""


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_queue = list(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self.free_queue):
            raise MemoryError(f"{num_blocks} blocks asked, {len(self.free_queue)} free")
        blocks, self.free_queue = self.free_queue[:num_blocks], self.free_queue[num_blocks:]
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks

    def append(self, table: list[int], num_tokens: int) -> list[int]:
        needed = -(-num_tokens // self.block_size) - len(table)
        new = self.allocate(needed) if needed > 0 else []
        table.extend(new)
        return new

    def incref(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref_counts[block] == 0:
                raise ValueError(f"block {block} is free")
            self.ref_counts[block] += 1

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref_counts[block] == 0:
                raise ValueError(f"double free of block {block}")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue.append(block)
