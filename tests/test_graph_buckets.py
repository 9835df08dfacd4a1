"""minillm/graphs/buckets.py: which buckets exist and which one a batch pads up to, exactly."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minillm.graphs import batch_size_buckets, bucket_for


@pytest.mark.parametrize("max_num_seqs, step, largest, expected", [
    (1, 8, None, [1]),
    (5, 8, None, [1, 2, 4, 5]),
    (16, 8, None, [1, 2, 4, 8, 16]),
    (40, 8, None, [1, 2, 4, 8, 16, 24, 32, 40]),
    (37, 8, None, [1, 2, 4, 8, 16, 24, 32, 37]),
    (64, 16, None, [1, 2, 4, 8, 16, 32, 48, 64]),
    (256, 8, 20, [1, 2, 4, 8, 16, 20]),
    (3, 1, None, [1, 2, 3]),
])
def test_buckets(max_num_seqs, step, largest, expected):
    assert batch_size_buckets(max_num_seqs, step, largest) == expected


@given(st.integers(1, 300), st.integers(1, 32))
def test_every_batch_up_to_the_largest_has_the_smallest_bucket_that_holds_it(max_num_seqs, step):
    buckets = batch_size_buckets(max_num_seqs, step)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_num_seqs
    for n in range(1, max_num_seqs + 1):
        b = bucket_for(n, buckets)
        assert b >= n and all(x < n for x in buckets if x < b)
    assert bucket_for(max_num_seqs + 1, buckets) is None


def test_bad_arguments_are_refused():
    for args in [(0, 8), (8, 0)]:
        with pytest.raises(ValueError):
            batch_size_buckets(*args)
    with pytest.raises(ValueError, match="at least one row"):
        bucket_for(0, [1, 2])
