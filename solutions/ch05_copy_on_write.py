"""Reference solution of `ch05.copy_on_write`."""


class ForkingAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_queue = list(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables: dict[str, list[int]] = {}

    def allocate(self, seq: str, num_tokens: int) -> list[int]:
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
        if seq not in self.tables:
            raise ValueError(f"sequence {seq!r} holds no blocks")
        for block in self.tables.pop(seq):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue.append(block)

    def fork(self, parent: str, child: str) -> list[int]:
        if parent not in self.tables:
            raise ValueError(f"sequence {parent!r} holds no blocks")
        if child in self.tables:
            raise ValueError(f"sequence {child!r} already has a block table")
        table = list(self.tables[parent])  # the child's own list: its later copies must not change the parent's
        for block in table:
            self.ref_counts[block] += 1
        self.tables[child] = table
        return list(table)

    def prepare_write(self, seq: str, start: int, end: int) -> list[tuple[int, int]]:
        if seq not in self.tables:
            raise ValueError(f"sequence {seq!r} holds no blocks")
        table = self.tables[seq]
        grow = max(0, -(-end // self.block_size) - len(table))
        touched = range(start // self.block_size, (end - 1) // self.block_size + 1)
        shared = [i for i in touched if i < len(table) and self.ref_counts[table[i]] > 1]
        if grow + len(shared) > len(self.free_queue):
            raise MemoryError(f"the write needs {grow + len(shared)} blocks, {len(self.free_queue)} free")
        for _ in range(grow):
            block = self.free_queue.pop(0)
            self.ref_counts[block] = 1
            table.append(block)
        copies = []
        for i in shared:  # blocks added just now have one holder: only older, shared ones are copied
            copy = self.free_queue.pop(0)
            self.ref_counts[copy] = 1
            self.ref_counts[table[i]] -= 1  # > 0 still: the other holders keep it
            copies.append((table[i], copy))
            table[i] = copy
        return copies
