"""minillm/attention/causal.py computes what one fully masked attention call computes: a fresh
prefill, a small extend and a large (split) extend, for GQA groups of 1, 2 and 4, in float32 and
bfloat16 — and the split path really runs where the score matrix is large (causal.SPLIT_FROM)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm.attention import causal
from minillm.attention.causal import causal_attention


def masked_reference(q, keys, values, start, scale):
    n, end = q.shape[2], keys.shape[2]
    visible = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start)
    group = q.shape[1] // keys.shape[1]
    return F.scaled_dot_product_attention(q.float(), keys.float().repeat_interleave(group, 1),
                                          values.float().repeat_interleave(group, 1), attn_mask=visible, scale=scale)


# (300, 200) and (1000, 70) are above causal.SPLIT_FROM: the split; the other extends one masked call
CASES = [(0, 1), (0, 37), (0, 300), (500, 3), (100, 40), (7, 200), (1, 2), (64, 64), (300, 200), (1000, 70)]


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 2)])
@pytest.mark.parametrize("start,n", CASES)
def test_equals_one_masked_call(start, n, heads, kv_heads):
    torch.manual_seed(start * 1000 + n)
    q = torch.randn(1, heads, n, 32)
    keys, values = torch.randn(1, kv_heads, start + n, 32), torch.randn(1, kv_heads, start + n, 32)
    got = causal_attention(q, keys, values, start, scale=0.2)
    torch.testing.assert_close(got, masked_reference(q, keys, values, start, 0.2), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("start,n", [(0, 64), (40, 60), (900, 90)])
def test_bfloat16(start, n):
    torch.manual_seed(n)
    q = torch.randn(1, 4, n, 64).bfloat16()
    keys, values = torch.randn(1, 2, start + n, 64).bfloat16(), torch.randn(1, 2, start + n, 64).bfloat16()
    got = causal_attention(q, keys, values, start, scale=0.125)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), masked_reference(q, keys, values, start, 0.125), atol=2e-2, rtol=2e-2)


def test_each_shape_takes_the_path_its_docstring_names(monkeypatch):
    """Fresh prefills take is_causal; large extends the split; small ones one masked call."""
    taken = []
    split = causal._split_extend
    monkeypatch.setattr(causal, "_split_extend", lambda *a: taken.append("split") or split(*a))
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        taken.append("causal" if kwargs.get("is_causal") else "masked")
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(causal.F, "scaled_dot_product_attention", spy)
    for start, n in [(0, 100), (300, 200), (1000, 5)]:
        causal_attention(torch.randn(1, 4, n, 16), torch.randn(1, 2, start + n, 16), torch.randn(1, 2, start + n, 16),
                         start, 0.25)
    assert taken == ["causal", "split", "masked"]
