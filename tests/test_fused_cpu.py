"""The fused CPU kernels (minillm/model/fused_cpu.py) equal the torch code they replace, step aside
where they must (autograd, torch.compile, other dtypes, turned off), and the model with them equals
the model without them — and Hugging Face's — on logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minillm
from minillm.attention import DenseAttention
from minillm.generate import generate_without_cache
from minillm.model import fused_cpu
from minillm.model.layers import GatedMLP, RMSNorm
from minillm.model.rope import RotaryEmbedding
from minillm.sampling import SamplingParams

pytestmark = pytest.mark.skipif(fused_cpu.unavailable_reason() is not None,
                                reason=f"fused kernels unavailable: {fused_cpu.unavailable_reason()}")


def _torch_norm(x, weight, eps):
    return weight * F.rms_norm(x, weight.shape, eps=eps)


@pytest.mark.parametrize("rows,size", [(1, 256), (37, 256), (600, 896), (3, 7), (0, 64)])
def test_rms_norm_with_and_without_the_residual_equals_torch(rows, size):
    gen = torch.Generator().manual_seed(rows * 1000 + size)
    x, residual = torch.randn(rows, size, generator=gen) * 3, torch.randn(rows, size, generator=gen)
    weight = torch.randn(size, generator=gen)
    normed, summed = fused_cpu.rms_norm(x, weight, 1e-6)
    assert summed is x
    torch.testing.assert_close(normed, _torch_norm(x, weight, 1e-6), atol=1e-5, rtol=1e-5)
    normed, summed = fused_cpu.rms_norm(x, weight, 1e-6, residual)
    assert torch.equal(summed, residual + x)  # the add itself is exact
    torch.testing.assert_close(normed, _torch_norm(residual + x, weight, 1e-6), atol=1e-5, rtol=1e-5)


def test_rms_norm_reads_a_non_contiguous_input():
    x = torch.randn(8, 512)[:, ::2]  # (8, 256), every other column
    weight = torch.randn(256)
    torch.testing.assert_close(fused_cpu.rms_norm(x, weight, 1e-5)[0], _torch_norm(x, weight, 1e-5))


@pytest.mark.parametrize("heads,kv_heads,head_dim,rows", [(4, 2, 64, 9), (14, 2, 64, 700), (2, 2, 8, 1)])
def test_rope_in_place_equals_the_rotation(heads, kv_heads, head_dim, rows):
    config = minillm.ModelConfig(family="llama", vocab_size=16, hidden_size=heads * head_dim, intermediate_size=8,
                                 num_layers=1, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                 max_position_embeddings=2048)
    rotation = RotaryEmbedding(config).at(torch.randint(0, 2048, (rows,)), torch.float32)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(rows, q_size + 2 * kv_size)
    q, k, v = qkv.clone().split([q_size, kv_size, kv_size], dim=-1)
    want_q, want_k = rotation.apply(q.reshape(rows, heads, head_dim), k.reshape(rows, kv_heads, head_dim))
    fused_cpu.rope_(qkv, rotation.cos, rotation.signed_sin, heads + kv_heads, head_dim)
    got_q, got_k, got_v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    torch.testing.assert_close(got_q.reshape(rows, heads, head_dim), want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k.reshape(rows, kv_heads, head_dim), want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(got_v, v)  # v is not touched
    with pytest.raises(ValueError, match="contiguous values"):
        fused_cpu.rope_(qkv[:, :8], rotation.cos, rotation.signed_sin, heads + kv_heads, head_dim)


def test_silu_mul_equals_torch_over_the_whole_range():
    gate_up = torch.cat([torch.linspace(-120, 120, 4001).view(1, -1), torch.randn(1, 4001)], dim=1).repeat(3, 1)
    gate, up = gate_up.split(4001, dim=-1)
    torch.testing.assert_close(fused_cpu.silu_mul(gate_up), F.silu(gate) * up, atol=1e-6, rtol=2e-6)


def test_the_layers_step_aside_for_autograd_compile_and_other_dtypes(monkeypatch):
    calls = []
    monkeypatch.setattr(fused_cpu, "rms_norm", lambda *a, **k: calls.append(a) or (a[0], a[0]))
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(3, 16)
    norm(x)  # a parameter that wants a gradient, outside inference mode: the torch code
    assert not calls
    with torch.inference_mode():
        norm(x)
        norm(x.double())
    assert len(calls) == 1  # float32 only
    compiled = torch.compile(lambda t: norm(t), backend="eager", fullgraph=True)
    with torch.inference_mode():
        compiled(x)
    assert len(calls) == 1  # traced by torch.compile: the torch code


def test_the_model_with_and_without_the_kernels_gives_the_same_logits_and_tokens(monkeypatch):
    """The shipped model: logits within float rounding, and the naive loop's greedy tokens identical."""
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    ids = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())[:300]
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    fused_logits, fused = _logits(model, ids), generate_without_cache(model, tokenizer, ids[:40], params).token_ids
    monkeypatch.setattr(fused_cpu, "usable", lambda *tensors: False)
    plain_logits, plain = _logits(model, ids), generate_without_cache(model, tokenizer, ids[:40], params).token_ids
    torch.testing.assert_close(fused_logits, plain_logits, atol=2e-4, rtol=1e-4)
    assert fused == plain and len(fused) == 24


@torch.inference_mode()
def _logits(model, ids):
    return model.logits(model(torch.tensor(ids), torch.arange(len(ids)), DenseAttention([len(ids)])))


def test_mlp_uses_the_fused_kernel_under_inference():
    mlp = GatedMLP(8, 16, bias=False)
    x = torch.randn(5, 8)
    with torch.inference_mode():
        fused = mlp(x)
    gate, up = mlp.gate_up_proj(x).split(16, dim=-1)
    torch.testing.assert_close(fused, mlp.down_proj(F.silu(gate) * up), atol=1e-6, rtol=1e-5)


def test_turned_off_or_unbuildable_the_layers_run_their_torch_code(monkeypatch, tmp_path):
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(3, 16)
    try:
        for env, value, reason in (("MINILLM_FUSED_CPU", "0", "MINILLM_FUSED_CPU=0"),
                                   ("CC", str(tmp_path / "no-such-compiler"), "no-such-compiler")):
            monkeypatch.setenv(env, value)
            monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))  # nothing built there: the compiler is asked
            fused_cpu._library.cache_clear()
            assert reason in fused_cpu.unavailable_reason()
            with torch.inference_mode():
                assert not fused_cpu.usable(x) and torch.equal(norm(x), _torch_norm(x, norm.weight, 1e-6))
            monkeypatch.undo()
    finally:
        monkeypatch.undo()
        fused_cpu._library.cache_clear()
    assert fused_cpu.unavailable_reason() is None
