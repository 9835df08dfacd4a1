"""Chapter 8 exercise `ch08.pad`: choose a decode batch's bucket and pad it up to it."""


def pad_to_bucket(rows: list[tuple[int, int, list[int]]], buckets: list[int], width: int, block_size: int,
                  pad_block: int) -> dict[str, list] | None:
    """Pad a batch of decodes up to the smallest bucket that holds it.

    rows: one (token_id, position, block_table) per decoding request: the token it runs this step, that
    token's position, and its blocks (enough for position + 1 tokens). buckets: sorted batch sizes.
    Return None if no bucket holds len(rows) (the step then runs eagerly). Otherwise a dict of lists,
    `bucket` entries each (the rows in order, then padding rows):
      "input_ids"     the token (padding: 0)
      "positions"     its position (padding: 0)
      "slot_mapping"  where its K/V go: table[position // block_size] * block_size + position % block_size
                      (padding: the first slot of the pad block, pad_block * block_size)
      "block_tables"  its table followed by pad_block up to `width` entries (padding: width x pad_block)
      "context_lens"  tokens it attends to, its own included: position + 1 (padding: 1)
    Example: rows [(7, 5, [3, 0])], buckets [1, 2, 4], width 3, block_size 4, pad_block 9 -> bucket 1:
    {"input_ids": [7], "positions": [5], "slot_mapping": [1], "block_tables": [[3, 0, 9]], "context_lens": [6]}.
    Do not modify `rows`.
    """
    raise NotImplementedError("ch08.pad: pick the smallest bucket that holds the rows, then pad them up to it")
