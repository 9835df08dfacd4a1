"""Chapter 4 exercise `ch04.slot_mapping`: where each token's K/V goes in the paged cache."""


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """The physical slot of every token position in [start, end).

    Token t lives in block `block_table[t // block_size]` at offset `t % block_size`; a block holds
    slots block * block_size ... block * block_size + block_size - 1.
    Raise ValueError if a position lies beyond the table's blocks.
    """
    raise NotImplementedError("ch04.slot_mapping: implement slot_mapping")
