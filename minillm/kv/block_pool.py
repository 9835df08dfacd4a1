"""The block pool: bookkeeping of a paged KV cache, in plain integers (no torch here).

KV memory is cut into `num_blocks` blocks of `block_size` tokens. A request holds a *block table*,
the list of its blocks in token order; its blocks need not be adjacent:

    block_size = 4                      logical block:   0    1    2
    request A, 10 tokens:  table [7, 2, 9]   ->  tokens 0-3 | 4-7 | 8-9 (2 of 4 used)
    token t lives in block table[t // 4] at offset t % 4, i.e. in slot  table[t // 4] * 4 + t % 4

Only a request's last block can be partly empty, so at most `block_size - 1` slots per request are
wasted (internal fragmentation), and any free block fits anyone (no external fragmentation).

Blocks carry reference counts so that several requests can share one (chapter 5). Without a prefix
cache, a block returns to the free queue when its count drops to zero. With one
(`prefix_cache=True`, `minillm/kv/prefix_cache.py`), a full block whose last holder lets go keeps
its K/V and stays findable: it becomes *cached and evictable*. Allocation takes never-used (or
forgotten) blocks from the free queue first; only when that is empty does it evict the least
recently used evictable block, forgetting its key. Eviction order is deterministic: blocks become
evictable in the order they are released, and a request releases its blocks last block first, so
a prefix's tail is evicted before its head (heads are the most shared). Misuse — freeing a free
block, an unknown block id or request — raises instead of corrupting the pool.

    block:      free queue ──take──► held (ref >= 1) ──last holder lets go──► free queue   (not cached)
                     ▲                   ▲       │                              │
                     │                  hit      └──────────────────────► evictable (cached, ref 0, LRU)
                     └───────────evict (forget its key)──────────────────────────┘
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from minillm.kv.prefix_cache import CachedBlock, KeyFn, PrefixCache, block_key


class OutOfBlocks(RuntimeError):
    """The pool cannot supply the blocks asked for (the scheduler preempts and retries)."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16, prefix_cache: bool = False,
                 key_fn: KeyFn = block_key):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_queue: deque[int] = deque(range(num_blocks))  # taken from the left, returned on the right
        self.ref_counts = [0] * num_blocks
        self.tables: dict[str, list[int]] = {}  # request id -> its blocks in token order
        self.cache = PrefixCache(block_size, key_fn) if prefix_cache else None
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, nobody holds them; least recently used first
        self.chains: dict[str, list[CachedBlock] | None] = {}  # request id -> entries of its leading full blocks
        #                                                        (None: a collision stopped its caching)
        self.events: list[tuple] = []  # with a prefix cache: what happened to blocks, in order (see drain_events)

    # ------------------------------------------------------------------ physical blocks
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: never used (or forgotten), then evictable cached ones."""
        return len(self.free_queue) + len(self.evictable)

    def take(self, count: int) -> list[int]:
        """`count` blocks, each with reference count 1: from the free queue first, then by evicting
        the least recently used cached blocks. OutOfBlocks (taking none) if too few."""
        if count > self.num_free_blocks:
            raise OutOfBlocks(f"asked for {count} blocks, {self.num_free_blocks} free of {self.num_blocks}")
        blocks = []
        for _ in range(count):
            block = self.free_queue.popleft() if self.free_queue else self._evict()
            self.ref_counts[block] = 1
            self._log("alloc", block)
            blocks.append(block)
        return blocks

    def _evict(self) -> int:
        """The least recently used evictable block, its key forgotten. Its descendants are forgotten
        too (no lookup can reach them now); those nobody holds go to the free queue."""
        block = next(iter(self.evictable))  # the least recently used; forgotten before it leaves the queue
        descendants = self.cache.forget(block)[1:]
        del self.evictable[block]
        self._log("evict", block)
        for other in descendants:
            self._log("forget", other)
            if other in self.evictable:
                del self.evictable[other]
                self.free_queue.append(other)
        return block

    def _log(self, *event) -> None:
        if self.cache is not None:
            self.events.append(event)

    def drain_events(self) -> list[tuple]:
        """What happened since the last call, in order (empty without a prefix cache):
        ("alloc", block) taken, ("hit", block) shared from the cache, ("cache", block, parent block
        or -1, token ids) became cached, ("release", block) cached and evictable now (most recently
        used end), ("evict", block) evicted for reuse, ("forget", block) uncached with an evicted
        ancestor, ("fork", block) one more holder by a fork, ("copy", block, copy) copied on write."""
        events, self.events = self.events, []
        return events

    def incref(self, blocks: Iterable[int]) -> None:
        """One more holder for blocks that are in use."""
        for block in blocks:
            self._check_in_use(block)
            self.ref_counts[block] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        """One holder fewer; a block nobody holds becomes evictable if it is cached, else free."""
        for block in blocks:
            self._check_in_use(block)
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.cache is not None and self.cache.is_cached(block):
                    self.evictable[block] = None  # the most recently used end
                    self._log("release", block)
                else:
                    self.free_queue.append(block)

    def share(self, blocks: Iterable[int]) -> None:
        """One more holder for cached blocks found by a lookup, evictable ones included."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                if block not in self.evictable:
                    raise ValueError(f"block {block} is free and not cached: nothing to share")
                del self.evictable[block]
            self.ref_counts[block] += 1
            self._log("hit", block)

    def _check_in_use(self, block: int) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"unknown block {block!r}: ids run from 0 to {self.num_blocks - 1}")
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is free: double free, or a block that was never allocated")

    # ------------------------------------------------------------------ requests' block tables
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, ()))

    def num_missing_blocks(self, request_id: str, num_tokens: int) -> int:
        """Blocks the request must still get so that its table holds `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(self.tables.get(request_id, ())))

    def can_hold(self, request_id: str, num_tokens: int) -> bool:
        return self.num_missing_blocks(request_id, num_tokens) <= self.num_free_blocks

    def _shared_blocks(self, request_id: str, start: int, end: int) -> list[int]:
        """Indices in the request's table of the blocks that positions [start, end) touch and that
        another sequence holds too."""
        table = self.tables.get(request_id, [])
        last = min(self.blocks_for(end), len(table)) if start < end else 0  # an empty range writes nothing
        return [i for i in range(start // self.block_size, last) if self.ref_counts[table[i]] > 1]

    def can_write(self, request_id: str, start: int, end: int) -> bool:
        """Whether `prepare_write` can succeed: blocks to hold `end` tokens, and a copy of each shared
        block that positions [start, end) touch."""
        needed = self.num_missing_blocks(request_id, end) + len(self._shared_blocks(request_id, start, end))
        return needed <= self.num_free_blocks

    def prepare_write(self, request_id: str, start: int, end: int) -> list[tuple[int, int]]:
        """Make positions [start, end) of a request writable: grow its table to hold `end` tokens, and
        replace every block they touch that another sequence also holds by a fresh copy of it
        (copy-on-write). Returns the (source block, copy) pairs whose K/V the cache must copy before
        the step writes; the other holders keep the source, untouched.

            samples A and B share [7, 2] after a fork; A writes token 9 (block index 1):
            A [7, 2] ──► A [7, 5], copy 2 ─► 5          B keeps [7, 2]; block 2 now has one holder
        """
        if not self.can_write(request_id, start, end):
            raise OutOfBlocks(f"writing positions [{start}, {end}) of request {request_id!r} needs more blocks "
                              f"than the {self.num_free_blocks} free")
        self.append(request_id, end)
        table, copies = self.tables[request_id], []
        for i in self._shared_blocks(request_id, start, end):
            (copy,) = self.take(1)
            self._log("copy", table[i], copy)
            self.decref([table[i]])
            copies.append((table[i], copy))
            table[i] = copy
        return copies

    def fork(self, parent_id: str, child_id: str) -> list[int]:
        """A new sequence that shares every block of `parent_id` (each gets one more holder): the
        samples of one prompt (`SamplingParams.n`), forked once the prompt is computed. The first
        write into a shared block copies it (`prepare_write`). Returns the child's table."""
        if child_id in self.tables:
            raise ValueError(f"request {child_id!r} already has a block table")
        table = self._table(parent_id)
        self.incref(table)
        for block in table:
            self._log("fork", block)
        self.tables[child_id] = list(table)
        if self.cache is not None:  # the child's leading full blocks are the parent's, already cached
            chain = self.chains.get(parent_id)
            self.chains[child_id] = None if chain is None else list(chain)
        return list(table)

    def find_cached(self, token_ids: Sequence[int]) -> list[CachedBlock]:
        """The cached leading full blocks of `token_ids` a new request may reuse. At least its last
        token is always left to compute — its logits give the next token — so a fully cached run of
        tokens gives back its last block: that block is recomputed into a fresh block, and nothing is
        ever written into a shared one."""
        if self.cache is None:
            return []
        return self.cache.lookup(token_ids)[: (len(token_ids) - 1) // self.block_size]

    def can_allocate(self, num_tokens: int, cached: Sequence[CachedBlock] = ()) -> bool:
        """Whether `allocate` can give a new request blocks for `num_tokens` tokens, reusing `cached`
        (reviving an evictable cached block takes it out of what new blocks could use)."""
        reviving = sum(1 for e in cached if self.ref_counts[e.block_id] == 0)
        return self.blocks_for(num_tokens) - len(cached) <= self.num_free_blocks - reviving

    def allocate(self, request_id: str, num_tokens: int, cached: Sequence[CachedBlock] = (),
                 readmitted: bool = False) -> list[int]:
        """A new block table for a request's first `num_tokens` tokens: the `cached` blocks (from
        `find_cached`, shared), then fresh ones. `readmitted`: a preempted request coming back, which
        finds its own blocks again — counted apart, since no two prompts shared anything."""
        if request_id in self.tables:
            raise ValueError(f"request {request_id!r} already has a block table")
        if not self.can_allocate(num_tokens, cached):
            raise OutOfBlocks(f"{num_tokens} tokens need {self.blocks_for(num_tokens) - len(cached)} new blocks, "
                              f"{self.num_free_blocks} free of {self.num_blocks}")
        shared = [e.block_id for e in cached]
        self.share(shared)
        self.tables[request_id] = shared + self.take(self.blocks_for(num_tokens) - len(shared))
        if self.cache is not None:
            self.chains[request_id] = list(cached)
            self.cache.count_lookup(num_tokens, len(shared) * self.block_size, readmitted)
        return list(self.tables[request_id])

    def cache_full_blocks(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Make the request's full blocks whose K/V are computed (its first `num_computed` tokens)
        findable by later requests."""
        chain = self.chains.get(request_id)
        if self.cache is None or chain is None:
            return
        table, size = self._table(request_id), self.block_size
        for i in range(len(chain), num_computed // size):
            parent = chain[-1] if chain else None
            entry = self.cache.insert(table[i], parent, token_ids[i * size : (i + 1) * size])
            if entry is None:  # a key collision, or an ancestor evicted meanwhile: cache no further
                self.chains[request_id] = None
                return
            if entry.block_id == table[i]:
                self._log("cache", table[i], parent.block_id if parent else -1, entry.token_ids)
            chain.append(entry)  # the entry standing for this prefix, even when another block holds it

    def adopt(self, token_ids: Sequence[int]) -> tuple[list[tuple[int, int]], list[int]]:
        """Room for K/V computed elsewhere (disaggregated prefill, chapter 13): the full blocks of `token_ids`
        become cached here, as if a request had computed them, so the request that follows finds them as a
        prefix-cache hit. Returns (writes, held): (block index in `token_ids`, block id) for each block whose
        K/V must now be written — blocks cached already are not taken again — and every block of the chain,
        held (nothing evicts them) until `release(held)`. Takes no more than the free blocks: a shorter chain
        only means the request computes more itself."""
        if self.cache is None:
            raise ValueError("adopting K/V computed elsewhere needs the prefix cache (prefix_cache=True)")
        size, found = self.block_size, self.cache.lookup(token_ids)
        held = [e.block_id for e in found]
        self.share(held)  # our own chain must not be evicted to make room for its next block
        writes: list[tuple[int, int]] = []
        parent = found[-1] if found else None
        for index in range(len(found), len(token_ids) // size):
            if self.num_free_blocks == 0:
                break
            block = self.take(1)[0]
            entry = self.cache.insert(block, parent, token_ids[index * size : (index + 1) * size])
            if entry is None or entry.block_id != block:  # a key collision: cache no further
                self.decref([block])
                break
            self._log("cache", block, parent.block_id if parent else -1, entry.token_ids)
            writes.append((index, block))
            held.append(block)
            parent = entry
        return writes, held

    def release(self, held: Sequence[int]) -> None:
        """Let go of `adopt`'s blocks, the chain's tail first: cached, they wait as evictable hits."""
        self.decref(reversed(held))

    def append(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow a request's table until it holds `num_tokens` tokens; returns the new blocks."""
        table = self._table(request_id)
        new = self.take(self.num_missing_blocks(request_id, num_tokens))
        table.extend(new)
        return new

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Shrink a request's table to the blocks `num_tokens` tokens need, releasing the rest, last
        block first (speculative decoding: blocks taken for guesses the target rejected). Those
        blocks were never full of computed tokens, so none of them is cached."""
        table = self._table(request_id)
        keep = self.blocks_for(num_tokens)
        if keep < len(table):
            self.decref(reversed(table[keep:]))
            del table[keep:]

    def free(self, request_id: str) -> None:
        """Release every block of a request (finished, aborted or preempted). With a prefix cache
        the last block goes first, so that a prefix's tail becomes evictable before its head."""
        table = self._table(request_id)
        self.decref(reversed(table) if self.cache is not None else table)
        del self.tables[request_id]
        self.chains.pop(request_id, None)

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Physical slot of each token position in [start, end)."""
        table, size = self._table(request_id), self.block_size
        if not 0 <= start <= end <= len(table) * size:
            raise ValueError(f"positions [{start}, {end}) are outside the {len(table) * size} slots of "
                             f"request {request_id!r}")
        return [table[p // size] * size + p % size for p in range(start, end)]

    def _table(self, request_id: str) -> list[int]:
        if request_id not in self.tables:
            raise ValueError(f"request {request_id!r} holds no blocks")
        return self.tables[request_id]

    # ------------------------------------------------------------------ invariants
    @property
    def is_idle(self) -> bool:
        """Nobody holds anything: no table left, every count zero, and every block either free or
        cached and evictable — each exactly once."""
        cached = self.cache.by_block.keys() if self.cache is not None else set()
        everywhere = list(self.free_queue) + list(self.evictable)
        return (not self.tables and not self.chains and not any(self.ref_counts)
                and sorted(everywhere) == list(range(self.num_blocks))
                and set(self.evictable) == set(cached) and not cached & set(self.free_queue))
