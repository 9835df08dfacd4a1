"""Solution of `ch04.slot_mapping`."""


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    if end > len(block_table) * block_size:
        raise ValueError(f"position {end - 1} is beyond the {len(block_table)} blocks of the table")
    return [block_table[t // block_size] * block_size + t % block_size for t in range(start, end)]
