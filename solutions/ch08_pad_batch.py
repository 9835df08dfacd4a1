"""Solution of `ch08.pad`."""


def pad_to_bucket(rows, buckets, width, block_size, pad_block):
    bucket = next((b for b in buckets if b >= len(rows)), None)  # buckets are sorted: the first that holds them
    if bucket is None:
        return None
    padding = bucket - len(rows)
    return {
        "input_ids": [token for token, _, _ in rows] + [0] * padding,
        "positions": [position for _, position, _ in rows] + [0] * padding,
        "slot_mapping": [table[position // block_size] * block_size + position % block_size
                         for _, position, table in rows] + [pad_block * block_size] * padding,
        "block_tables": [list(table) + [pad_block] * (width - len(table)) for _, _, table in rows]
                        + [[pad_block] * width for _ in range(padding)],
        "context_lens": [position + 1 for _, position, _ in rows] + [1] * padding,
    }
