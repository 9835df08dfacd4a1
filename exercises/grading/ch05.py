"""Chapter 5's cases: `ch05.block_keys` (chained block keys), `ch05.evict` (LRU eviction of cached
blocks), `ch05.reusable_blocks` (which cached blocks a request may reuse, with a hash that may
collide) and `ch05.copy_on_write` (n samples of one prompt: fork, and copy a shared block on its
first write)."""

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
        return f" ({len(got)} key{'s' * (len(got) != 1)}, not {len(want)})"
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
    a.do([0, 1], "allocate", 2, why="the front of the free queue")
    a.expect_state([2, 3], [], [1, 1, 0, 0], set(), "two blocks taken from the front")
    a.do(None, "cache", 0), a.do(None, "release", 0)
    a.do([2], "allocate", 1, why="a free block is left, so the cached block 0 is kept")
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
    a.do([1], "allocate", 1, why="no free block: 1, released first, is the least recently used")
    a.expect_state([], [0], [0, 1, 1], {0, 2}, "1 was released first: least recently used, evicted and uncached")


@evict.case
def a_hit_revives_an_evictable_block_and_protects_it(cls: type) -> None:
    """A hit takes an evictable block out of evictable, with one holder; held blocks are never evicted."""
    a = _Allocator(cls, 2)
    a.do([0, 1], "allocate", 2)
    a.do(None, "cache", 0), a.do(None, "release", 0), a.do(None, "release", 1)
    a.do(None, "hit", 0)
    a.expect_state([1], [], [1, 0], {0}, "block 0 found by a lookup: held again")
    a.do([1], "allocate", 1, why="the free block; block 0 is held again")
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
    a.do([2, 0], "allocate", 2, why="the free block, then the evictable one")


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
                    a.do(pool.take(k), "allocate", k, why="what minillm's BlockPool hands out")
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


# ----------------------------------------------------------------------------- ch05.reusable_blocks

reusable = exercise("ch05.reusable_blocks", "ch05_reusable_blocks", "reusable_blocks")

Cache = dict[int, tuple[int, tuple[int, ...], int | None]]


def chained(parent: int | None, tokens: tuple[int, ...]) -> int:
    """A good hash: chapter 5's chained key."""
    return hash((parent, tokens, ()))


def always_42(parent: int | None, tokens: tuple[int, ...]) -> int:
    """The worst hash: every block collides with every other."""
    return 42


def tokens_only(parent: int | None, tokens: tuple[int, ...]) -> int:
    """A hash that forgets the chain: the same tokens after different beginnings collide."""
    return hash(tokens)


def _cache_of(blocks: list[tuple[int, tuple[int, ...], int | None]], key_fn: Callable) -> Cache:
    """The cache holding `blocks` (block id, tokens, parent block id), keyed as a real cache would key
    them: each chained through its parent's key."""
    keys: dict[int, int] = {}
    cache: Cache = {}
    for block_id, tokens, parent in blocks:
        keys[block_id] = key_fn(keys.get(parent) if parent is not None else None, tokens)
        cache.setdefault(keys[block_id], (block_id, tokens, parent))
    return cache


def _expect_blocks(fn: Callable, token_ids: list[int], block_size: int, cache: Cache, key_fn: Callable,
                   want: list[int], why: str) -> None:
    blocks = {tuple(token_ids[i : i + block_size]) for i in range(0, len(token_ids), block_size)}
    relevant = {k: v for k, v in cache.items() if v[1] in blocks}  # a big cache: only the entries that could matter
    shown = ", ".join(f"{k if abs(k) < 1000 else '<key>'}: {v}" for k, v in relevant.items())  # long keys: unreadable
    hidden = len(cache) - len(relevant)
    if not hidden:
        described = f"cache={{{shown}}}"
    elif relevant:
        described = f"a cache of {len(cache)} entries, those holding these tokens {{{shown}}}"
    else:
        described = f"a cache of {hidden} entr{'y' if hidden == 1 else 'ies'}, none holding a block of these tokens"
    given = f"reusable_blocks({token_ids}, block_size={block_size}, {described}, key_fn={key_fn.__name__})"
    got = call(given, f"{want} ({why})", fn, list(token_ids), block_size, dict(cache), key_fn)
    expect(isinstance(got, list) and got == want, given, f"{want} ({why})", repr(got))


@reusable.case
def reuses_the_longest_run_of_leading_cached_blocks(fn: Callable) -> None:
    """Reuses the longest run of leading cached blocks."""
    cache = _cache_of([(7, (1, 2), None), (3, (3, 4), 7), (5, (5, 6), 3)], chained)
    _expect_blocks(fn, [1, 2, 3, 4, 9], 2, cache, chained, [7, 3], "blocks (1, 2) and (3, 4) are cached; 9 is new")
    _expect_blocks(fn, [8, 8, 3, 4, 5], 2, cache, chained, [], "the first block differs, so nothing after it fits")


@reusable.case
def stops_at_the_first_miss(fn: Callable) -> None:
    """Stops at the first miss: a block after a miss is never reused."""
    cache = _cache_of([(7, (1, 2), None), (5, (5, 6), 7)], tokens_only)
    _expect_blocks(fn, [1, 2, 0, 0, 5, 6, 1], 2, cache, tokens_only, [7],
                   "(0, 0) is a miss; the cached (5, 6) came right after (1, 2), here (0, 0) comes between")


@reusable.case
def a_colliding_key_with_other_tokens_is_a_miss(fn: Callable) -> None:
    """A key that collides with other tokens is a miss, not someone else's K/V."""
    cache = _cache_of([(4, (9, 9), None)], always_42)
    _expect_blocks(fn, [1, 2, 3], 2, cache, always_42, [], "key 42 holds (9, 9), not (1, 2)")
    _expect_blocks(fn, [9, 9, 3], 2, cache, always_42, [4], "key 42 holds (9, 9) with nothing before: a real hit")


@reusable.case
def the_same_tokens_after_a_different_beginning_are_a_miss(fn: Callable) -> None:
    """The same tokens after a different beginning are a miss: the block before must be this request's too."""
    cache = _cache_of([(1, (5, 5), None), (6, (7, 7), None), (2, (8, 8), 6)], tokens_only)
    _expect_blocks(fn, [5, 5, 8, 8, 0], 2, cache, tokens_only, [1],
                   "(8, 8) is cached after (7, 7) — block 6 — not after (5, 5)")


@reusable.case
def at_least_one_token_is_left_to_compute(fn: Callable) -> None:
    """At least one token is left to compute, even when every block is cached."""
    cache = _cache_of([(7, (1, 2), None), (3, (3, 4), 7)], chained)
    _expect_blocks(fn, [1, 2, 3, 4], 2, cache, chained, [7],
                   "all 4 tokens are cached: the last block is computed again, for its logits")
    _expect_blocks(fn, [1, 2, 3, 4, 0], 2, cache, chained, [7, 3], "token 0 is left to compute")
    _expect_blocks(fn, [1, 2], 2, cache, chained, [], "one block only: it is the one computed")


@reusable.case
def fewer_tokens_than_a_block_reuse_nothing(fn: Callable) -> None:
    """Fewer tokens than a block, or none, reuse nothing."""
    cache = _cache_of([(7, (1, 2), None)], chained)
    _expect_blocks(fn, [1], 2, cache, chained, [], "one token: no full block")
    _expect_blocks(fn, [], 2, cache, chained, [], "no tokens")


@reusable.case
def the_inputs_are_left_unchanged(fn: Callable) -> None:
    """The inputs are left as they were."""
    cache = _cache_of([(7, (1, 2), None)], chained)
    tokens, before = [1, 2, 3], dict(cache)
    call("reusable_blocks([1, 2, 3], 2, cache, chained)", "no error", fn, tokens, 2, cache, chained)
    expect(tokens == [1, 2, 3] and cache == before, "reusable_blocks([1, 2, 3], 2, cache, chained)",
           "the token list and the cache unchanged",
           f"tokens {tokens}, cache {'unchanged' if cache == before else cache}")


@reusable.case
def matches_the_engines_prefix_cache_with_colliding_hashes(fn: Callable) -> None:
    """Matches minillm's BlockPool.find_cached on random prompts, for each of the three hashes."""
    from minillm.kv.block_pool import BlockPool

    rng = random.Random(11)
    for key_fn in (chained, always_42, tokens_only):
        pool = BlockPool(64, 2, prefix_cache=True, key_fn=lambda parent, tokens, extra, f=key_fn: f(parent, tokens))
        for r in range(12):  # requests from a small alphabet: shared beginnings, repeats, collisions
            tokens = [rng.randint(0, 2) for _ in range(rng.randint(1, 9))]
            cache = {e.key: (e.block_id, e.token_ids, e.parent.block_id if e.parent else None)
                     for e in pool.cache.by_block.values()}
            want = [e.block_id for e in pool.find_cached(tokens)]
            _expect_blocks(fn, tokens, 2, cache, key_fn, want, "what minillm's prefix cache finds")
            hit = pool.find_cached(tokens)
            pool.allocate(str(r), len(tokens), hit)
            pool.cache_full_blocks(str(r), tokens, len(tokens))
            pool.free(str(r))


# ----------------------------------------------------------------------------- ch05.copy_on_write

cow = exercise("ch05.copy_on_write", "ch05_copy_on_write", "ForkingAllocator")


class _Forking(Story):
    """A ForkingAllocator of the learner's, and the calls made on it."""

    def __init__(self, cls: Any, num_blocks: int, block_size: int):
        super().__init__("ForkingAllocator", cls, num_blocks=num_blocks, block_size=block_size)

    def write(self, want: list[tuple[int, int]], seq: str, start: int, end: int, why: str) -> None:
        """prepare_write(seq, start, end) must return the pairs `want` (lists of two count as pairs)."""
        self.story += f", prepare_write({seq!r}, {start}, {end})"
        expected = f"it to return {want!r} ({why})"
        got = call(self.story, expected, lambda: self.impl.prepare_write(seq, start, end))
        pairs = [tuple(p) for p in got] if isinstance(got, list) and all(
            isinstance(p, tuple | list) and len(p) == 2 for p in got) else None
        expect(pairs == want, self.story, expected, repr(got))

    def expect_state(self, free_queue: list[int], ref_counts: list[int], tables: dict[str, list[int]],
                     why: str) -> None:
        got = call(f"after {self.story}", "attributes free_queue, ref_counts and tables", lambda: (
            list(self.impl.free_queue), list(self.impl.ref_counts),
            {seq: list(table) for seq, table in self.impl.tables.items()}))
        show = lambda q, r, t: f"free_queue {q}, ref_counts {r}, tables {t}"  # noqa: E731
        expect(got == (free_queue, ref_counts, tables), f"after {self.story}",
               f"{show(free_queue, ref_counts, tables)} ({why})", show(*got))


def _forked(cls: Any, num_blocks: int = 6, prompt: int = 10) -> _Forking:
    """A holds a prompt of `prompt` tokens (blocks of 4), and B was forked from it."""
    a = _Forking(cls, num_blocks, 4)
    a.do(list(range(-(-prompt // 4))), "allocate", "A", prompt)
    a.do(list(range(-(-prompt // 4))), "fork", "A", "B")
    return a


@cow.case
def fork_shares_every_block_and_takes_none(cls: type) -> None:
    """fork takes no block: the child's table holds the parent's blocks, each with one more holder."""
    a = _forked(cls)
    a.expect_state([3, 4, 5], [2, 2, 2, 0, 0, 0], {"A": [0, 1, 2], "B": [0, 1, 2]},
                   "B shares A's three blocks; nothing is copied until someone writes")
    a.do([0, 1, 2], "fork", "A", "C")
    a.expect_state([3, 4, 5], [3, 3, 3, 0, 0, 0], {"A": [0, 1, 2], "B": [0, 1, 2], "C": [0, 1, 2]},
                   "a third sample: three holders per block")


@cow.case
def the_first_write_into_a_shared_block_copies_it(cls: type) -> None:
    """The first write into a block another sequence holds copies it."""
    a = _forked(cls)
    a.write([(2, 3)], "A", 10, 11, "position 10 is in block 2, which B holds too: A gets block 3 in its place")
    a.expect_state([4, 5], [2, 2, 1, 1, 0, 0], {"A": [0, 1, 3], "B": [0, 1, 2]},
                   "B keeps block 2 untouched; A holds its copy, block 3")


@cow.case
def a_copy_lets_go_of_the_shared_block(cls: type) -> None:
    """A copy lets go of the shared block: its count falls by one, and the last holder's free returns it."""
    a = _forked(cls)
    a.write([(2, 3)], "A", 10, 11, "A copies block 2")
    a.do(None, "free", "B")
    a.expect_state([4, 5, 2], [1, 1, 0, 1, 0, 0], {"A": [0, 1, 3]},
                   "after the copy, B was block 2's only holder: its free returns block 2")


@cow.case
def the_last_holder_writes_in_place(cls: type) -> None:
    """The last holder of a block writes in place: no copy when nobody else holds it."""
    a = _forked(cls)
    a.write([(2, 3)], "A", 10, 11, "A copies block 2")
    a.write([], "B", 10, 11, "B is now block 2's only holder")
    a.expect_state([4, 5], [2, 2, 1, 1, 0, 0], {"A": [0, 1, 3], "B": [0, 1, 2]}, "B wrote into block 2 in place")
    a.write([], "A", 11, 12, "block 3 is A's own")
    solo = _Forking(cls, 4, 4)
    solo.do([0, 1], "allocate", "S", 5)
    solo.write([], "S", 5, 6, "nobody ever shared S's blocks")


@cow.case
def only_the_blocks_the_write_touches_are_copied(cls: type) -> None:
    """Only the blocks the write touches are copied: full blocks before it stay shared."""
    a = _forked(cls, num_blocks=8, prompt=10)
    a.write([(2, 3)], "A", 10, 11, "blocks 0 and 1 are full: nobody writes into them again, they stay shared")
    a.expect_state([4, 5, 6, 7], [2, 2, 1, 1, 0, 0, 0, 0], {"A": [0, 1, 3], "B": [0, 1, 2]},
                   "blocks 0 and 1 keep both holders")
    b = _forked(cls, num_blocks=8, prompt=12)
    b.write([(1, 3), (2, 4)], "A", 6, 12, "positions 6-11 touch blocks 1 and 2 (table indices 1 and 2), not 0")


@cow.case
def a_write_into_a_fresh_block_copies_nothing(cls: type) -> None:
    """A prompt that ends on a block boundary: the next token goes into a fresh block, and nothing is copied."""
    a = _forked(cls, num_blocks=6, prompt=8)
    a.write([], "A", 8, 9, "position 8 starts a new block: A grows by block 2, its own")
    a.write([], "B", 8, 9, "B grows by block 3")
    a.expect_state([4, 5], [2, 2, 1, 1, 0, 0], {"A": [0, 1, 2], "B": [0, 1, 3]}, "blocks 0 and 1 stay shared")


@cow.case
def a_write_grows_the_table_first_then_copies(cls: type) -> None:
    """A write grows the table first, then copies, in table order."""
    a = _forked(cls, num_blocks=8, prompt=10)
    a.write([(2, 4)], "A", 10, 14, "positions 10-13 need block index 3: block 3 is taken to grow, then "
            "block 4 for the copy of the shared block 2")
    a.expect_state([5, 6, 7], [2, 2, 1, 1, 1, 0, 0, 0], {"A": [0, 1, 4, 3], "B": [0, 1, 2]},
                   "A's table: the copy in block 2's place, the new block at the end")


@cow.case
def three_samples_copy_the_partial_block_twice(cls: type) -> None:
    """Three samples of one prompt: the partial block is copied once per sample but the last, and free returns all."""
    a = _Forking(cls, 8, 4)
    a.do([0, 1, 2], "allocate", "q", 10)
    a.do([0, 1, 2], "fork", "q", "q#1")
    a.do([0, 1, 2], "fork", "q", "q#2")
    a.write([(2, 3)], "q", 10, 11, "three hold block 2")
    a.write([(2, 4)], "q#1", 10, 11, "two still hold block 2")
    a.write([], "q#2", 10, 11, "q#2 is block 2's last holder")
    a.expect_state([5, 6, 7], [3, 3, 1, 1, 1, 0, 0, 0], {"q": [0, 1, 3], "q#1": [0, 1, 4], "q#2": [0, 1, 2]},
                   "blocks 0 and 1 shared by all three, one partial block each")
    for seq in ("q", "q#1", "q#2"):
        a.write([], seq, 11, 12, "block index 2 is the writer's own now")
    for seq in ("q", "q#1", "q#2"):
        a.write([], seq, 12, 13, "position 12 starts a new block, taken from the free queue")
    a.expect_state([], [3, 3, 1, 1, 1, 1, 1, 1], {"q": [0, 1, 3, 5], "q#1": [0, 1, 4, 6], "q#2": [0, 1, 2, 7]},
                   "blocks 5, 6 and 7 grew the three tables")
    for seq in ("q", "q#1", "q#2"):
        a.do(None, "free", seq)
    a.expect_state([3, 5, 4, 6, 0, 1, 2, 7], [0] * 8, {},
                   "all three done: blocks 0 and 1 return with their last holder, none lost")


@cow.case
def a_write_that_runs_out_raises_memory_error_and_changes_nothing(cls: type) -> None:
    """A write the free queue cannot supply (new blocks and copies together) raises MemoryError and changes nothing."""
    a = _forked(cls, num_blocks=3, prompt=10)
    a.fails(MemoryError, "prepare_write", "A", 10, 11)
    a.expect_state([], [2, 2, 2], {"A": [0, 1, 2], "B": [0, 1, 2]}, "no free block for the copy of block 2")
    b = _forked(cls, num_blocks=4, prompt=10)
    b.fails(MemoryError, "prepare_write", "A", 10, 13)
    b.expect_state([3], [2, 2, 2, 0], {"A": [0, 1, 2], "B": [0, 1, 2]},
                   "one block is free, the write needs two: one to grow, one to copy block 2")
    b.write([(2, 3)], "A", 10, 11, "one block is enough for this one")


@cow.case
def fork_of_an_unknown_parent_or_into_an_existing_sequence_raises_value_error(cls: type) -> None:
    """fork of a sequence without a table, or into one that has a table, raises ValueError and changes nothing."""
    a = _Forking(cls, 4, 4)
    a.do([0, 1], "allocate", "A", 5)
    a.fails(ValueError, "fork", "nobody", "B")
    a.do([2], "allocate", "C", 1)
    a.fails(ValueError, "fork", "A", "C")
    a.expect_state([3], [1, 1, 1, 0], {"A": [0, 1], "C": [2]}, "errors change nothing")
    a.fails(ValueError, "prepare_write", "nobody", 0, 1)


@cow.case
def a_forked_table_is_the_childs_own_list(cls: type) -> None:
    """A forked table is the child's own list: a copy in one sequence's table never changes another's."""
    a = _forked(cls)
    a.write([(2, 3)], "B", 10, 11, "B writes first this time")
    a.expect_state([4, 5], [2, 2, 1, 1, 0, 0], {"A": [0, 1, 2], "B": [0, 1, 3]}, "A's table is untouched")
    a.story += ", fork('A', 'C')"
    got = call(a.story, "it to return [0, 1, 2]", lambda: a.impl.fork("A", "C"))
    expect(isinstance(got, list) and got == [0, 1, 2], a.story, "it to return [0, 1, 2]", repr(got))
    got.append(99)  # the caller's list: changing it must not change the allocator's tables
    a.story += " (its result appended 99)"
    a.expect_state([4, 5], [3, 3, 2, 1, 0, 0], {"A": [0, 1, 2], "B": [0, 1, 3], "C": [0, 1, 2]},
                   "fork returns a copy of the table; appending to it changes no table")


@cow.case
def forks_and_writes_match_the_engines_block_pool(cls: type) -> None:
    """Matches minillm's BlockPool (fork, prepare_write) on random samples of random prompts."""
    from minillm.kv.block_pool import BlockPool, OutOfBlocks

    rng = random.Random(7)
    for _ in range(30):
        num_blocks, block_size = rng.randint(6, 16), rng.choice([2, 3, 4])
        pool, a = BlockPool(num_blocks, block_size), _Forking(cls, num_blocks, block_size)
        lengths: dict[str, int] = {}  # tokens each sequence holds
        for step in range(25):
            few = len(lengths) < 3  # a new prompt now and then; mostly forks and writes
            op = rng.choice(["allocate"] * few + ["fork"] * 2 + ["write"] * 3 + ["free"] if lengths else ["allocate"])
            if op == "allocate":
                seq, tokens = f"s{step}", rng.randint(1, 3 * block_size)
                try:
                    want = pool.allocate(seq, tokens)
                except OutOfBlocks:
                    a.fails(MemoryError, "allocate", seq, tokens)
                else:
                    a.do(want, "allocate", seq, tokens)
                    lengths[seq] = tokens
            elif op == "fork":
                parent, child = rng.choice(sorted(lengths)), f"s{step}"
                a.do(pool.fork(parent, child), "fork", parent, child)
                lengths[child] = lengths[parent]
            elif op == "write":
                seq = rng.choice(sorted(lengths))
                start, end = lengths[seq], lengths[seq] + rng.choice([1, 1, 1, 2, block_size + 1])
                try:
                    want = pool.prepare_write(seq, start, end)
                except OutOfBlocks:
                    a.fails(MemoryError, "prepare_write", seq, start, end)
                else:
                    a.write(want, seq, start, end, "what minillm's BlockPool copies")
                    lengths[seq] = end
            else:
                seq = rng.choice(sorted(lengths))
                pool.free(seq)
                a.do(None, "free", seq)
                del lengths[seq]
            a.expect_state(list(pool.free_queue), list(pool.ref_counts),
                           {seq: pool.block_table(seq) for seq in pool.tables}, "as minillm's BlockPool")
