"""Chapter 5 exercise `ch05.block_keys`: the chained key of every full block."""


def block_keys(token_ids: list[int], block_size: int) -> list[int]:
    """The key of each FULL block of `token_ids`, in order (a partly filled last block has none).

    key of block 0 = hash((None, tuple(its tokens), ()))
    key of block i = hash((key of block i - 1, tuple(its tokens), ()))
    (minillm/kv/prefix_cache.py::block_key, with no extra key). Do not modify `token_ids`.
    """
    raise NotImplementedError("ch05.block_keys: implement block_keys")
