"""Batch-size buckets: a recorded step has fixed shapes, so a step of 5 decodes runs the step
recorded for 8, with 3 rows of padding.

    buckets (max_num_seqs=40):  1 2 4 8 16 24 32 40
    a batch of 5 ────────────────────► 8   (3 padding rows: computed, written nowhere real, dropped)
    a batch of 41 ──► no bucket: runs eagerly

Small batches get powers of two (their padding would otherwise be most of the step), larger ones
steps of `step`: a bucket costs a capture (and its memory) at start-up, padding costs compute at
every step that uses it.
"""

from __future__ import annotations

import bisect


def batch_size_buckets(max_num_seqs: int, step: int = 8, largest: int | None = None) -> list[int]:
    """1, 2, 4, ... below `step`, then multiples of `step`, up to `largest` (default max_num_seqs),
    which is always a bucket itself."""
    if max_num_seqs < 1 or step < 1:
        raise ValueError(f"need max_num_seqs >= 1 and step >= 1, got {max_num_seqs} and {step}")
    top = max_num_seqs if largest is None else min(largest, max_num_seqs)
    if top < 1:
        raise ValueError(f"the largest bucket must be >= 1, got {largest}")
    sizes = {1 << i for i in range(top.bit_length()) if 1 << i < step and 1 << i <= top}
    sizes |= set(range(step, top + 1, step)) | {top}
    return sorted(sizes)


def bucket_for(batch_size: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds `batch_size` rows, or None above the largest (run eagerly)."""
    if batch_size < 1:
        raise ValueError(f"a batch has at least one row, got {batch_size}")
    i = bisect.bisect_left(buckets, batch_size)
    return buckets[i] if i < len(buckets) else None
