"""The prefix cache: full KV blocks found again by their contents (integers only, no torch).

A full block's K/V depend on its own tokens *and every token before it*. So its key chains its
parent's key with its own token ids:

    tokens:  [The cat sat on | the mat and | ...]          block_size = 4
    key 0 = H(None,  (The, cat, sat, on))
    key 1 = H(key 0, (the, mat, and, ...))                  equal keys <=> equal prefixes (up to a collision)

Two requests that start with the same tokens compute the same keys for their common full blocks,
and the second finds the first one's blocks by key. A lookup never trusts the key alone: it also
compares the block's stored token ids and its parent *entry*, so a hash collision can only cost a
miss, never return someone else's K/V.

Only full blocks are cached — the last, partly filled block of a request is still changing — but
full blocks of *generated* tokens count too: the next turn of a chat resends the previous answer.

The cached blocks form a tree (a forest): each entry's parent is the entry of the block before it.
The cache keeps that invariant: forgetting an entry (its block is evicted) forgets its descendants
too, since no lookup could reach them any more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

KeyFn = Callable[[int | None, tuple[int, ...], tuple], int]


def block_key(parent_key: int | None, token_ids: Sequence[int], extra: tuple = ()) -> int:
    """The key of a full block: its parent's key (None for a request's first block), its own token
    ids, and an extra key for anything else its K/V depend on (none yet)."""
    return hash((parent_key, tuple(token_ids), extra))


def block_keys(token_ids: Sequence[int], block_size: int, key_fn: KeyFn = block_key, extra: tuple = ()) -> list[int]:
    """The keys of every full block of `token_ids`, in order (a partial last block has none)."""
    keys: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        keys.append(key_fn(keys[-1] if keys else None, tuple(token_ids[start : start + block_size]), extra))
    return keys


@dataclass(eq=False)
class CachedBlock:
    """One cached full block: where it lives, what it holds, and what comes before it."""

    block_id: int
    key: int
    token_ids: tuple[int, ...]
    parent: CachedBlock | None
    children: list[CachedBlock] = field(default_factory=list)


class PrefixCache:
    """Key -> cached block, and block id -> its entry. Knows nothing of reference counts or free
    lists: the block pool decides when a block may be forgotten (it is evicted)."""

    def __init__(self, block_size: int, key_fn: KeyFn = block_key, extra: tuple = ()):
        self.block_size, self.key_fn, self.extra = block_size, key_fn, extra
        self.by_key: dict[int, CachedBlock] = {}
        self.by_block: dict[int, CachedBlock] = {}
        self.queried_tokens = 0  # tokens looked up at admissions
        self.hit_tokens = 0  # of those, tokens found cached
        self.readmitted_queried_tokens = 0  # the same for preempted requests coming back (counted apart, as
        self.readmitted_hit_tokens = 0  #     vLLM does: a request finding its own blocks again is no sharing)

    def __len__(self) -> int:
        return len(self.by_block)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self.by_block

    def is_live(self, entry: CachedBlock | None) -> bool:
        """True when `entry` is still the cache's entry for its block (not forgotten since)."""
        return entry is None or self.by_block.get(entry.block_id) is entry

    def lookup(self, token_ids: Sequence[int]) -> list[CachedBlock]:
        """The cached entries of the longest run of leading full blocks of `token_ids`."""
        found: list[CachedBlock] = []
        size = self.block_size
        for start in range(0, len(token_ids) - size + 1, size):
            tokens = tuple(token_ids[start : start + size])
            parent = found[-1] if found else None
            entry = self.by_key.get(self.key_fn(parent.key if parent else None, tokens, self.extra))
            if entry is None or entry.token_ids != tokens or entry.parent is not parent:
                break  # a miss, or a collision caught by the comparison
            found.append(entry)
        return found

    def insert(self, block_id: int, parent: CachedBlock | None, token_ids: Sequence[int]) -> CachedBlock | None:
        """Cache full block `block_id`, whose tokens follow `parent`'s. Returns the entry that now
        stands for this prefix: the new one, or an existing entry with the same contents (another
        request computed the same prefix first; `block_id` stays uncached). None when it cannot be
        cached: its key collides with a different prefix, or `parent` was forgotten meanwhile."""
        tokens = tuple(token_ids)
        if len(tokens) != self.block_size:
            raise ValueError(f"only full blocks are cached: got {len(tokens)} tokens, block_size {self.block_size}")
        if not self.is_live(parent):
            return None
        key = self.key_fn(parent.key if parent else None, tokens, self.extra)
        existing = self.by_key.get(key)
        if existing is not None:
            return existing if existing.token_ids == tokens and existing.parent is parent else None
        if block_id in self.by_block:
            raise ValueError(f"block {block_id} is already cached for another prefix")
        entry = CachedBlock(block_id, key, tokens, parent)
        if parent is not None:
            parent.children.append(entry)
        self.by_key[key] = self.by_block[block_id] = entry
        return entry

    def forget(self, block_id: int) -> list[int]:
        """Drop a block's entry and, with it, its descendants' (no lookup could reach them). Returns
        the block ids forgotten, the block first, then its descendants depth first."""
        entry = self.by_block.get(block_id)
        if entry is None:
            return []
        if entry.parent is not None:
            entry.parent.children.remove(entry)
        forgotten, stack = [], [entry]
        while stack:
            node = stack.pop()
            forgotten.append(node.block_id)
            del self.by_block[node.block_id], self.by_key[node.key]
            stack.extend(reversed(node.children))
            node.children = []
        return forgotten

    def count_lookup(self, queried: int, hit: int, readmitted: bool = False) -> None:
        """Count one admission's lookup: `queried` tokens, `hit` of them found cached."""
        if readmitted:
            self.readmitted_queried_tokens += queried
            self.readmitted_hit_tokens += hit
        else:
            self.queried_tokens += queried
            self.hit_tokens += hit

    @property
    def hit_rate(self) -> float:
        """Share of looked-up prompt tokens that were served from the cache (first admissions only)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
