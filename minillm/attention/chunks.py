"""The attention backend of one forward pass over a step's scheduled chunks, whichever the cache."""

from __future__ import annotations

from minillm.attention.contiguous import ContiguousBatch, ContiguousKVCache
from minillm.attention.paged import PagedBatch, PagedKVCache


def batch_for(cache: ContiguousKVCache | PagedKVCache, chunks, starts: list[int] | None = None,
              query_lens: list[int] | None = None) -> ContiguousBatch | PagedBatch:
    """The attention backend of one pass over `chunks`: each in its slot, or through its block table
    kept in the row of its slot. `starts` / `query_lens`: when the pass feeds other tokens than the
    chunks' own (the draft model's passes); default the chunks' own."""
    starts = [c.start for c in chunks] if starts is None else starts
    query_lens = [c.num_tokens for c in chunks] if query_lens is None else query_lens
    if isinstance(cache, PagedKVCache):
        return cache.batch([c.block_table for c in chunks], starts, query_lens, rows=[c.slot for c in chunks])
    return cache.batch([c.slot for c in chunks], starts, query_lens)
