"""Chapter 5's cases: `ch05.block_keys` (chained block keys) and `ch05.evict` (LRU eviction of
cached blocks)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from exercises.grading.core import Story, call, exercise, expect

# ----------------------------------------------------------------------------- ch05.block_keys

keys = exercise("ch05.block_keys", "ch05_block_keys", "block_keys")


def _key(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens, ()))


def _first_difference(got: object, want: list[int]) -> str:
    """Where a list of keys first departs from the expected one (raw keys are hard to compare by eye)."""
    if not isinstance(got, list):
        return f" (a {type(got).__name__}, not a list)"
    if len(got) != len(want):
        return f" ({len(got)} keys, not {len(want)})"
    i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    return "" if i is None else f" (key {i} is the first that differs)"


def _expect_keys(fn: Callable, token_ids: list[int], block_size: int, want: list[int], why: str) -> None:
    given = f"block_keys({token_ids}, block_size={block_size})"
    got = call(given, f"{want} ({why})", fn, list(token_ids), block_size)
    expect(isinstance(got, list) and got == want, given, f"{want} ({why})", repr(got) + _first_difference(got, want))


@keys.case
def one_key_per_full_block_and_none_for_a_partial_last_block(fn: Callable) -> None:
    """As many keys as full blocks, in a list: a partly filled last block has none."""
    for token_ids, count, why in ((list(range(1, 11)), 2, "10 tokens: 2 full blocks, [9, 10] left over"),
                                  (list(range(1, 9)), 2, "8 tokens: exactly 2 full blocks"),
                                  (list(range(1, 13)), 3, "12 tokens: 3 full blocks")):
        given = f"block_keys({token_ids}, block_size=4)"
        got = call(given, f"a list of {count} keys ({why})", fn, list(token_ids), 4)
        expect(isinstance(got, list) and len(got) == count and all(isinstance(k, int) for k in got), given,
               f"a list of {count} int keys ({why})", repr(got))


@keys.case
def the_first_key_hashes_none_the_tokens_and_an_empty_extra(fn: Callable) -> None:
    """The first block's key is hash((None, tuple(tokens), ()))."""
    _expect_keys(fn, [7, 8, 9], 3, [_key(None, (7, 8, 9))], "hash((None, (7, 8, 9), ()))")


@keys.case
def each_key_chains_the_key_before_it(fn: Callable) -> None:
    """Each later key hashes the previous block's key with its own tokens."""
    k0 = _key(None, (9, 9))
    k1 = _key(k0, (1, 2))
    _expect_keys(fn, [9, 9, 1, 2, 3, 4], 2, [k0, k1, _key(k1, (3, 4))], "key i = hash((key i-1, tokens i, ()))")
    other = _key(_key(None, (8, 8)), (1, 2))
    expect(other != k1, "the same block (1, 2) after (9, 9) and after (8, 8)", "different keys", "equal keys")


@keys.case
def fewer_tokens_than_a_block_give_no_key(fn: Callable) -> None:
    """Fewer tokens than one block, or none, give no key."""
    _expect_keys(fn, [1, 2], 4, [], "2 tokens do not fill a block of 4")
    _expect_keys(fn, [], 4, [], "no tokens")


@keys.case
def the_token_list_is_left_unchanged(fn: Callable) -> None:
    """The token list is left as it was."""
    tokens = [5, 6, 7, 8, 9]
    call("block_keys([5, 6, 7, 8, 9], block_size=2)", "no error", fn, tokens, 2)
    expect(tokens == [5, 6, 7, 8, 9], "block_keys([5, 6, 7, 8, 9], block_size=2)", "the list unchanged", tokens)


@functools.cache
def _engine_cache() -> tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...]:
    """Run two requests sharing a prefix through minillm's engine with a prefix cache; return
    (request tokens, block size, the keys its cache stored for that request's blocks)."""
    from exercises.grading.ch01 import _cached_shipped_model
    from minillm import EngineConfig, SamplingParams
    from minillm.engine import LLMEngine

    model, tokenizer = _cached_shipped_model()
    engine = LLMEngine(model, tokenizer, EngineConfig(kv="paged", block_size=4, max_model_len=64, prefix_cache=True,
                                                      kv_cache_bytes=64 * 4 * 8192))
    out = []
    for prompt in ("ROMEO: But soft, what light", "ROMEO: But soft, my lord"):
        request = engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        tokens = request.all_token_ids[: request.num_computed_tokens]
        stored = engine.pool.cache.lookup(tokens)
        if len(tokens) % 4 == 0:
            tokens = tokens + [1]  # end on a partly filled block, which has no key
        out.append((tuple(tokens), 4, tuple(e.key for e in stored)))
    return tuple(out)


@keys.case
def equals_the_keys_the_engines_prefix_cache_stored(fn: Callable) -> None:
    """Equals the keys minillm's engine stored for real requests."""
    for tokens, block_size, stored in _engine_cache():
        got = call(f"block_keys(<{len(tokens)} tokens of a real request>, {block_size})", "the engine's keys", fn,
                   list(tokens), block_size)
        expect(isinstance(got, list) and got[: len(stored)] == list(stored) and len(got) == len(tokens) // block_size,
               f"block_keys({list(tokens)}, {block_size})", f"the engine's keys {list(stored)}",
               repr(got) + _first_difference(got[: len(stored)] if isinstance(got, list) else got, list(stored)))


# ----------------------------------------------------------------------------- ch05.evict

evict = exercise("ch05.evict", "ch05_evicting_allocator", "EvictingAllocator")


class _Allocator(Story):
    def __init__(self, cls: Any, num_blocks: int):
        super().__init__("EvictingAllocator", cls, num_blocks)

    def expect_state(self, free_queue: list[int], evictable: list[int], ref_counts: list[int], cached: set[int],
                     why: str) -> None:
        super().expect_state(why, free_queue=free_queue, evictable=evictable, ref_counts=ref_counts, cached=cached)


@evict.case
def allocate_takes_the_free_queue_first(cls: type) -> None:
    """allocate takes blocks from the front of the free queue, with ref count 1, before evicting anything."""
    a = _Allocator(cls, 4)
    a.do([0, 1], "allocate", 2)
    a.expect_state([2, 3], [], [1, 1, 0, 0], set(), "two blocks taken from the front")
    a.do(None, "cache", 0), a.do(None, "release", 0)
    a.do([2], "allocate", 1)
    a.expect_state([3], [0], [0, 1, 1, 0], {0}, "a free block was left: the cached block 0 is kept")


@evict.case
def a_released_cached_block_becomes_evictable_an_uncached_one_free(cls: type) -> None:
    """A released cached block goes to the back of evictable; an uncached one to the free queue."""
    a = _Allocator(cls, 4)
    a.do([0, 1, 2], "allocate", 3)
    a.do(None, "cache", 0), a.do(None, "cache", 2)
    a.do(None, "release", 2), a.do(None, "release", 1), a.do(None, "release", 0)
    a.expect_state([3, 1], [2, 0], [0, 0, 0, 0], {0, 2}, "2 then 0 evictable in release order; 1 was never cached")


@evict.case
def allocate_evicts_the_least_recently_used_once_the_free_queue_is_empty(cls: type) -> None:
    """With the free queue empty, allocate evicts from the front of evictable, which forgets the block."""
    a = _Allocator(cls, 3)
    a.do([0, 1, 2], "allocate", 3)
    for block in (0, 1, 2):
        a.do(None, "cache", block)
    a.do(None, "release", 1), a.do(None, "release", 0)
    a.do([1], "allocate", 1)
    a.expect_state([], [0], [0, 1, 1], {0, 2}, "1 was released first: least recently used, evicted and uncached")


@evict.case
def a_hit_revives_an_evictable_block_and_protects_it(cls: type) -> None:
    """A hit takes an evictable block out of evictable, with one holder; held blocks are never evicted."""
    a = _Allocator(cls, 2)
    a.do([0, 1], "allocate", 2)
    a.do(None, "cache", 0), a.do(None, "release", 0), a.do(None, "release", 1)
    a.do(None, "hit", 0)
    a.expect_state([1], [], [1, 0], {0}, "block 0 found by a lookup: held again")
    a.do([1], "allocate", 1)
    a.fails(MemoryError, "allocate", 1)


@evict.case
def a_shared_block_waits_for_its_last_holder(cls: type) -> None:
    """A block with two holders stays out of both lists until the second lets go."""
    a = _Allocator(cls, 3)
    a.do([0], "allocate", 1)
    a.do(None, "cache", 0), a.do(None, "hit", 0)
    a.expect_state([1, 2], [], [2, 0, 0], {0}, "two holders")
    a.do(None, "release", 0)
    a.expect_state([1, 2], [], [1, 0, 0], {0}, "one holder left")
    a.do(None, "release", 0)
    a.expect_state([1, 2], [0], [0, 0, 0], {0}, "nobody holds it: evictable")


@evict.case
def running_out_raises_memory_error_and_changes_nothing(cls: type) -> None:
    """Asking for more than free plus evictable raises MemoryError and changes nothing."""
    a = _Allocator(cls, 3)
    a.do([0, 1], "allocate", 2)
    a.do(None, "cache", 0), a.do(None, "release", 0)
    a.fails(MemoryError, "allocate", 3)
    a.expect_state([2], [0], [0, 1, 0], {0}, "2 blocks available (one free, one evictable), 3 asked")
    a.do([2, 0], "allocate", 2)


@evict.case
def misuse_raises_value_error(cls: type) -> None:
    """cache of a block nobody holds, hit of an uncached block and release of a free block raise ValueError."""
    a = _Allocator(cls, 2)
    a.fails(ValueError, "cache", 0)
    a.fails(ValueError, "hit", 1)
    a.do([0], "allocate", 1)
    a.do(None, "release", 0)
    a.fails(ValueError, "release", 0)
    a.expect_state([1, 0], [], [0, 0], set(), "errors change nothing")


@evict.case
def matches_the_engines_block_pool_on_random_operations(cls: type) -> None:
    """Matches minillm's BlockPool with a prefix cache on random operations."""
    from minillm.kv.block_pool import BlockPool, OutOfBlocks

    rng = random.Random(5)
    for _ in range(25):
        n = rng.randint(1, 6)
        pool, a = BlockPool(n, 1, prefix_cache=True), _Allocator(cls, n)
        for step in range(20):
            held = [b for b in range(n) if pool.ref_counts[b]]
            uncached_held = [b for b in held if not pool.cache.is_cached(b)]
            options = ["allocate"] + ["release"] * bool(held) + ["cache"] * bool(uncached_held)
            options += ["hit"] * bool(pool.cache.by_block)
            op = rng.choice(options)
            if op == "allocate":
                k = rng.randint(1, 3)
                try:
                    a.do(pool.take(k), "allocate", k)
                except OutOfBlocks:
                    a.fails(MemoryError, "allocate", k)
            elif op == "cache":
                block = rng.choice(uncached_held)
                pool.cache.insert(block, None, (1000 * step + block,))  # a root of its own: nothing to cascade
                a.do(None, "cache", block)
            elif op == "hit":
                block = rng.choice(sorted(pool.cache.by_block))
                pool.share([block])
                a.do(None, "hit", block)
            else:
                block = rng.choice(held)
                pool.decref([block])
                a.do(None, "release", block)
            a.expect_state(list(pool.free_queue), list(pool.evictable), list(pool.ref_counts),
                           set(pool.cache.by_block), "as minillm's BlockPool")
