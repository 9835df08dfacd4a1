"""Paged attention (torch reference) equals attention over the whole sequence, through scattered blocks."""

import pytest
import torch

from minillm.attention import DenseAttention
from minillm.attention.paged import PagedKVCache, kv_bytes_per_token, similar_lengths
from minillm.attention.paged_ops import paged_decode_attention

HEAD_DIM, NUM_BLOCKS = 8, 40


def random_tables(lengths: list[int], block_size: int, gen: torch.Generator) -> list[list[int]]:
    """Each sequence gets shuffled, non-adjacent physical blocks."""
    order = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    tables = []
    for n in lengths:
        count = -(-n // block_size)
        tables.append(order[:count])
        order = order[count:]
    return tables


@pytest.mark.parametrize("mix", ["boundaries", "short and long"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1), (2, 2)])
def test_prefill_then_mixed_pass_equals_dense_attention(block_size, heads, kv_heads, mix):
    gen = torch.Generator().manual_seed(block_size * heads)
    # lengths on, just past, and inside block boundaries; the last sequence has 2 tokens. Or a long
    # context beside short ones: the decode pass then attends in two groups of similar lengths
    lengths = [block_size, block_size + 1, 2 * block_size + 5, 2] if mix == "boundaries" else [block_size, 150, 2]
    seqs = [(torch.randn(n, heads, HEAD_DIM, generator=gen), torch.randn(n, kv_heads, HEAD_DIM, generator=gen),
             torch.randn(n, kv_heads, HEAD_DIM, generator=gen)) for n in lengths]
    cache = PagedKVCache(1, NUM_BLOCKS, block_size, kv_heads, HEAD_DIM)
    tables = random_tables(lengths, block_size, gen)
    # pass 1 prefills all but the last token (the last sequence: 1 token); pass 2 decodes the rest
    first = [n - 1 for n in lengths]
    q, k, v = (torch.cat([s[j][:m] for s, m in zip(seqs, first)]) for j in range(3))
    cache.batch(tables, [0] * len(lengths), first).attend(0, q, k, v, scale=0.3)
    q, k, v = (torch.cat([s[j][m:] for s, m in zip(seqs, first)]) for j in range(3))
    decode_pass = cache.batch(tables, first, [1] * len(lengths))
    assert len(decode_pass.decode_groups) == (1 if mix == "boundaries" else 2)
    out = decode_pass.attend(0, q, k, v, scale=0.3)
    expected = DenseAttention(lengths).attend(0, *(torch.cat([s[j] for s in seqs]) for j in range(3)), scale=0.3)
    last_rows = torch.stack([e[-1] for e in expected.split(lengths)])
    torch.testing.assert_close(out, last_rows, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lengths", [[1, 4, 5, 11], [3, 140, 7, 2]], ids=["one group", "two groups"])
def test_decode_reference_equals_a_per_sequence_loop(lengths):
    """The second set mixes short and long contexts (padded to the longest, the short rows must
    still see only their own keys)."""
    gen = torch.Generator().manual_seed(0)
    block_size, heads, kv_heads = 4, 4, 2
    k_cache = torch.randn(NUM_BLOCKS, block_size, kv_heads, HEAD_DIM, generator=gen)
    v_cache = torch.randn(NUM_BLOCKS, block_size, kv_heads, HEAD_DIM, generator=gen)
    tables = random_tables(lengths, block_size, gen)
    width = max(map(len, tables))
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(lengths), heads, HEAD_DIM, generator=gen)
    out = paged_decode_attention(q, k_cache, v_cache, padded, torch.tensor(lengths), scale=0.5)
    for i, (table, n) in enumerate(zip(tables, lengths)):
        keys = torch.cat([k_cache[b] for b in table])[:n].repeat_interleave(heads // kv_heads, dim=1)  # (n, heads, d)
        values = torch.cat([v_cache[b] for b in table])[:n].repeat_interleave(heads // kv_heads, dim=1)
        weights = torch.einsum("hd,nhd->hn", q[i], keys).mul(0.5).softmax(-1)
        torch.testing.assert_close(out[i], torch.einsum("hn,nhd->hd", weights, values), atol=1e-5, rtol=0)


def test_sizes_and_misuse():
    cache = PagedKVCache(num_layers=3, num_blocks=5, block_size=4, num_kv_heads=2, head_dim=8)
    assert cache.bytes_per_token == kv_bytes_per_token(3, 2, 8, torch.float32) == 2 * 3 * 2 * 8 * 4
    assert cache.nbytes == 5 * 4 * cache.bytes_per_token and cache.num_slots == 20
    assert cache.describe() == "paged KV cache: 5 blocks x 4 tokens = 20 tokens, 384 B per token, 7.5 KiB"
    with pytest.raises(ValueError, match="does not fit"):
        cache.batch([[0]], [3], [2])
    with pytest.raises(ValueError, match="outside"):
        cache.batch([[5]], [0], [1])


def test_decode_contexts_are_grouped_by_similar_length():
    assert similar_lengths([5, 40, 64, 100]) == [[0, 1, 2, 3]]  # all within 2 x 64: one group, one call
    assert similar_lengths([1500, 30, 200, 90, 1400]) == [[1, 3], [2], [4, 0]]  # <=128, <=400, then the long ones
