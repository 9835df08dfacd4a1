"""The prefix cache's torch-free part with exact ids: chained keys, hits and partial hits, reference
counts, the LRU eviction order, and a forced hash collision that must not reuse the wrong block."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.kv.block_pool import BlockPool, OutOfBlocks
from minillm.kv.prefix_cache import PrefixCache, block_key, block_keys


def admit(pool: BlockPool, request_id: str, tokens: list[int]) -> list[int]:
    """What the scheduler does at admission: look up, allocate, and (after the prefill) cache."""
    cached = pool.find_cached(tokens)
    table = pool.allocate(request_id, len(tokens), cached)
    pool.cache_full_blocks(request_id, tokens, len(tokens))
    return table


# ---------------------------------------------------------------------------------------------- keys
def test_a_key_chains_the_parents_key_with_the_blocks_tokens():
    keys = block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], block_size=4)
    assert len(keys) == 2  # the partial last block [9] has no key
    assert keys[0] == block_key(None, (1, 2, 3, 4)) == hash((None, (1, 2, 3, 4), ()))
    assert keys[1] == block_key(keys[0], (5, 6, 7, 8))


def test_the_same_block_after_a_different_prefix_has_a_different_key():
    a, b = block_keys([1, 2, 3, 4, 5, 6], 3), block_keys([9, 9, 9, 4, 5, 6], 3)
    assert a[1] != b[1]  # same tokens (4, 5, 6), different history
    assert block_keys([1, 2, 3, 4, 5, 6, 7], 3)[:2] == a  # a longer sequence extends the chain
    assert block_keys([1, 2], 3) == [] and block_keys([], 3) == []
    assert block_key(None, (1, 2), extra=("lora-a",)) != block_key(None, (1, 2))


# ---------------------------------------------------------------------------------------------- hits
def test_hits_and_partial_hits_with_exact_blocks():
    pool = BlockPool(num_blocks=8, block_size=4, prefix_cache=True)
    assert admit(pool, "A", list(range(10))) == [0, 1, 2]  # blocks 0, 1 full and cached; 2 holds 8, 9
    assert len(pool.cache) == 2
    # B shares the first block only (its second block differs at token 7)
    assert [e.block_id for e in pool.find_cached([0, 1, 2, 3, 4, 5, 6, 99, 8])] == [0]
    assert admit(pool, "B", [0, 1, 2, 3, 4, 5, 6, 99, 8]) == [0, 3, 4]
    assert pool.ref_counts[:5] == [2, 1, 1, 1, 1]
    assert pool.cache.hit_tokens == 4 and pool.cache.queried_tokens == 19


def test_a_fully_cached_prompt_recomputes_its_last_block_in_a_fresh_one():
    pool = BlockPool(num_blocks=8, block_size=4, prefix_cache=True)
    admit(pool, "A", list(range(8)))  # two full blocks, both cached
    pool.free("A")
    hit = pool.find_cached(list(range(8)))
    assert [e.block_id for e in hit] == [0]  # the last token must be computed: block 1 is not reused
    table = pool.allocate("B", 8, hit)
    assert table == [0, 2]  # the tail goes to a fresh block: nothing is written into the shared block 1
    assert [e.block_id for e in pool.find_cached(list(range(9)))] == [0, 1]  # with one token more, both hit
    pool.free("B")


def test_a_duplicate_block_is_not_cached_twice_and_the_chain_goes_on():
    pool = BlockPool(num_blocks=8, block_size=2, prefix_cache=True)
    pool.allocate("A", 4), pool.allocate("B", 6)  # both compute [1, 2] in the same step: no hit for B
    pool.cache_full_blocks("A", [1, 2, 3, 4], 4)
    pool.cache_full_blocks("B", [1, 2, 3, 4, 5, 6], 6)
    assert sorted(pool.cache.by_block) == [0, 1, 4]  # B's copies (2, 3) stay uncached, its [5, 6] chains on
    assert pool.cache.by_block[4].parent is pool.cache.by_block[1]
    pool.free("A"), pool.free("B")
    assert [e.block_id for e in pool.find_cached([1, 2, 3, 4, 5, 6, 7])] == [0, 1, 4]
    assert list(pool.free_queue)[-2:] == [3, 2] and list(pool.evictable) == [1, 0, 4]


# ---------------------------------------------------------------------------------------------- eviction
def test_released_blocks_stay_findable_until_evicted_least_recently_used_first():
    pool = BlockPool(num_blocks=4, block_size=2, prefix_cache=True)
    admit(pool, "A", [1, 2, 3, 4])  # blocks 0, 1
    admit(pool, "B", [7, 8, 9])  # blocks 2 (cached), 3
    pool.free("A")  # released last block first: 1, then 0
    pool.free("B")  # 3 is not cached: free queue; 2 evictable
    assert list(pool.evictable) == [1, 0, 2] and list(pool.free_queue) == [3]
    assert pool.num_free_blocks == 4
    assert pool.take(2) == [3, 1]  # the free queue first, then the least recently used cached block
    assert not pool.cache.is_cached(1) and pool.cache.is_cached(0)
    assert pool.drain_events()[-3:] == [("alloc", 3), ("evict", 1), ("alloc", 1)]
    pool.decref([3, 1])


def test_a_hit_revives_an_evictable_block_and_protects_it_from_eviction():
    pool = BlockPool(num_blocks=3, block_size=2, prefix_cache=True)
    admit(pool, "A", [1, 2, 3])
    pool.free("A")
    assert list(pool.evictable) == [0]
    table = admit(pool, "B", [1, 2, 5])  # hit on block 0: ref 1, no longer evictable
    assert table == [0, 2] and pool.ref_counts[0] == 1 and not pool.evictable
    with pytest.raises(OutOfBlocks):
        pool.take(2)  # one block free; block 0 is held, so it cannot be evicted
    assert pool.can_allocate(2) and not pool.can_allocate(3)
    pool.free("B")
    assert pool.is_idle


def test_evicting_a_block_forgets_its_descendants():
    pool = BlockPool(num_blocks=4, block_size=1, prefix_cache=True)
    admit(pool, "A", [5, 6, 7, 8])  # one token per block: the chain 0 -> 1 -> 2 -> 3 is cached
    pool.free("A")
    assert list(pool.evictable) == [3, 2, 1, 0]  # released tail first
    pool.evictable.move_to_end(0, last=False)  # pretend the head is the least recently used
    assert pool.take(1) == [0]
    assert len(pool.cache) == 0 and list(pool.free_queue) == [1, 2, 3]  # unreachable descendants are free
    pool.decref([0])
    assert pool.is_idle


def test_admission_cannot_count_an_evictable_hit_block_as_free():
    pool = BlockPool(num_blocks=2, block_size=2, prefix_cache=True)
    admit(pool, "A", [1, 2, 3])
    pool.free("A")  # block 0 cached and evictable, block 1 free
    hit = pool.find_cached([1, 2, 9, 9, 9])
    assert [e.block_id for e in hit] == [0]
    assert not pool.can_allocate(5, hit)  # 3 blocks: 1 shared + 2 new, but only block 1 is left
    assert pool.can_allocate(4, hit)


# ---------------------------------------------------------------------------------------------- collisions
def test_a_forced_hash_collision_never_reuses_the_wrong_block():
    pool = BlockPool(num_blocks=6, block_size=2, prefix_cache=True, key_fn=lambda parent, tokens, extra: 42)
    admit(pool, "A", [1, 2, 3])
    pool.free("A")
    assert pool.find_cached([9, 9, 3]) == []  # same key, different tokens: a miss
    table = admit(pool, "B", [9, 9, 3])
    assert 0 not in table  # B computes its own block
    assert len(pool.cache) == 1 and pool.cache.by_block[0].token_ids == (1, 2)  # B's block was not cached
    pool.free("B")
    cache = PrefixCache(2, key_fn=lambda parent, tokens, extra: 7)
    root = cache.insert(0, None, (1, 2))
    assert cache.insert(1, root, (1, 2)) is None  # same key and tokens but a different parent: refused
    assert cache.lookup([1, 2, 1, 2]) == [root]


def test_only_full_blocks_are_cached():
    cache = PrefixCache(4)
    with pytest.raises(ValueError, match="full blocks"):
        cache.insert(0, None, (1, 2))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["admit", "free"]), st.integers(0, 5),
                              st.lists(st.integers(0, 3), min_size=1, max_size=12)), max_size=40),
       block_size=st.sampled_from([1, 2, 4]))
def test_random_admissions_keep_the_books_balanced(ops, block_size):
    """Every block is in exactly one place (free, evictable, or held with its true count), the cached
    entries form a tree, and every hit holds exactly the tokens asked for."""
    pool = BlockPool(num_blocks=10, block_size=block_size, prefix_cache=True)
    contents: dict[int, tuple[int, ...]] = {}  # what each block really holds (the test's own record)
    live: dict[str, list[int]] = {}
    for op, rid, tokens in ops:
        rid = str(rid)
        if op == "free" and rid in live:
            pool.free(rid)
            del live[rid]
        elif op == "admit" and rid not in live:
            cached = pool.find_cached(tokens)
            for i, e in enumerate(cached):  # a hit's block holds exactly this prefix's tokens
                assert contents[e.block_id] == tuple(tokens[: (i + 1) * block_size])
            if not pool.can_allocate(len(tokens), cached):
                continue
            table = pool.allocate(rid, len(tokens), cached)
            for i, block in enumerate(table[len(cached):], start=len(cached)):
                contents[block] = tuple(tokens[: (i + 1) * block_size])  # computed now
            pool.cache_full_blocks(rid, tokens, len(tokens))
            live[rid] = tokens
        held = [b for t in pool.tables.values() for b in t]
        assert all(pool.ref_counts[b] == held.count(b) for b in range(10))
        assert sorted(list(pool.free_queue) + list(pool.evictable) + sorted(set(held))) == list(range(10))
        for entry in pool.cache.by_block.values():
            assert entry.parent is None or pool.cache.by_block[entry.parent.block_id] is entry.parent
            assert pool.cache.by_key[entry.key] is entry
    for rid in live:
        pool.free(rid)
    assert pool.is_idle
