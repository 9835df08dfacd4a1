"""Reference solution of `ch05.block_keys`."""


def block_keys(token_ids: list[int], block_size: int) -> list[int]:
    keys: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):  # full blocks only
        parent = keys[-1] if keys else None
        keys.append(hash((parent, tuple(token_ids[start : start + block_size]), ())))
    return keys
