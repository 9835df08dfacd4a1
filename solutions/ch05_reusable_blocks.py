"""Reference solution of `ch05.reusable_blocks`."""

from collections.abc import Callable


def reusable_blocks(token_ids: list[int], block_size: int, cache: dict[int, tuple[int, tuple[int, ...], int | None]],
                    key_fn: Callable[[int | None, tuple[int, ...]], int]) -> list[int]:
    found: list[int] = []
    key = None
    full_blocks = (len(token_ids) - 1) // block_size  # the last token is always computed: its logits are needed
    for start in range(0, full_blocks * block_size, block_size):
        tokens = tuple(token_ids[start : start + block_size])
        key = key_fn(key, tokens)
        entry = cache.get(key)
        parent = found[-1] if found else None
        # a key is only a hint: the stored tokens and the block before must be this request's too
        if entry is None or entry[1] != tokens or entry[2] != parent:
            break
        found.append(entry[0])
    return found
