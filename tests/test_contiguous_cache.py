"""ContiguousKVCache at the attention level: cached attention equals attention over the whole sequence.

The decode path has two modes (read the slots in place, or gather a few of them); both are checked,
with GQA, against DenseAttention, which stores nothing.
"""

import pytest
import torch

from minillm.attention import ContiguousKVCache, DenseAttention

HEADS, KV_HEADS, HEAD_DIM, MAX_LEN, SLOTS = 4, 2, 8, 40, 8


def random_qkv(n: int, gen: torch.Generator):
    return (torch.randn(n, HEADS, HEAD_DIM, generator=gen), torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen),
            torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen))


@pytest.mark.parametrize("slots", [[0, 1, 2, 3], [5, 0, 2], [7], [6, 7]], ids=["dense", "unordered", "one", "sparse"])
def test_mixed_pass_equals_dense_attention(slots):
    gen = torch.Generator().manual_seed(len(slots))
    lengths = [int(torch.randint(2, MAX_LEN, (1,), generator=gen)) for _ in slots]
    seqs = [random_qkv(n, gen) for n in lengths]
    cache = ContiguousKVCache(num_layers=1, num_slots=SLOTS, max_len=MAX_LEN, num_kv_heads=KV_HEADS,
                              head_dim=HEAD_DIM)
    # pass 1: every sequence but the last one prefills all but its last token (the last one only 1)
    first = [n - 1 if i < len(slots) - 1 else 1 for i, n in enumerate(lengths)]
    q, k, v = (torch.cat([s[j][:m] for s, m in zip(seqs, first)]) for j in range(3))
    cache.batch(slots, [0] * len(slots), first).attend(0, q, k, v, scale=0.5)
    # pass 2: one decode token each, except the last sequence, which prefills the rest of its prompt
    rest = [n - m for n, m in zip(lengths, first)]
    q, k, v = (torch.cat([s[j][m:] for s, m in zip(seqs, first)]) for j in range(3))
    out = cache.batch(slots, first, rest).attend(0, q, k, v, scale=0.5)
    expected = DenseAttention(lengths).attend(0, *(torch.cat([s[j] for s in seqs]) for j in range(3)), scale=0.5)
    expected_rest = torch.cat([e[m:] for e, m in zip(expected.split(lengths), first)])
    torch.testing.assert_close(out, expected_rest, atol=1e-5, rtol=0)


def test_the_two_decode_modes_are_both_used():
    cache = ContiguousKVCache(1, SLOTS, MAX_LEN, KV_HEADS, HEAD_DIM)
    assert cache.batch([0, 1, 2], [3, 4, 5], [1, 1, 1]).in_place
    assert not cache.batch([7], [3], [1]).in_place  # one straggler in the last slot: gather it


def test_misuse_is_rejected():
    cache = ContiguousKVCache(1, SLOTS, MAX_LEN, KV_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="out of range"):
        cache.batch([SLOTS], [0], [1])
    with pytest.raises(ValueError, match="max_len"):
        cache.batch([0], [MAX_LEN - 1], [2])
    with pytest.raises(ValueError, match="once per forward pass"):
        cache.batch([1, 1], [0, 5], [5, 1])


def test_describe_reports_the_reservation():
    cache = ContiguousKVCache(num_layers=2, num_slots=3, max_len=10, num_kv_heads=2, head_dim=8)
    assert cache.nbytes == 3 * 10 * (2 * 2 * 2 * 8 * 4)
    assert cache.describe() == "contiguous KV cache: 3 slots x 10 tokens reserved, 256 B per token, 7.5 KiB"
