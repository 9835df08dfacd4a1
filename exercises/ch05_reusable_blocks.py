"""Chapter 5 exercise `ch05.reusable_blocks`: which cached blocks may a new request reuse?"""

from collections.abc import Callable


def reusable_blocks(token_ids: list[int], block_size: int, cache: dict[int, tuple[int, tuple[int, ...], int | None]],
                    key_fn: Callable[[int | None, tuple[int, ...]], int]) -> list[int]:
    """The block ids, in order, of the cached blocks a new request with `token_ids` may reuse.

    cache: key -> (block id, the block's token ids as a tuple, the block id of the block before it
    in its request, or None for a first block); a block's key is key_fn(key of the block before it,
    or None, its token ids) — the chained key of chapter 5, with a hash that may collide.
    Reuse the longest run of leading full blocks whose cached K/V are exactly this request's, and
    always leave at least one token to compute. Right for any key_fn. Do not modify the inputs.
    """
    raise NotImplementedError("ch05.reusable_blocks: implement reusable_blocks")
