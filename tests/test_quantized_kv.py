"""The paged KV cache in int8 or fp8 (chapter 12): the codes round-trip within their step, the cache holds
the bytes it says, and every engine configuration — preemption, the prefix cache, chunked prefill,
speculative decoding, compiled decode steps — gives the tokens of the naive loop whose K/V go through the
same codes. Bad combinations are refused naming the field."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minillm.attention import kv_codes, paged_ops
from minillm.attention.paged import PagedKVCache, kv_bytes_per_token
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.quantization import quantize_model
from minillm.quantization.kv_oracle import naive_greedy
from tests.hf_reference import ByteTokenizer
from tests.test_engine import run_to_completion

KV_DTYPES = ["int8", "fp8"]


# -------------------------------------------------------------------------------------------------- codes
def test_int8_codes_are_within_half_a_step_per_token_and_head():
    x = torch.randn(7, 3, 64) * torch.tensor([0.1, 1.0, 30.0])[None, :, None]  # heads of very different ranges
    codes, scale = kv_codes.quantize(x, "int8")
    assert codes.dtype is torch.int8 and scale.shape == (7, 3) and scale.dtype is torch.float16
    back = kv_codes.dequantize(codes, scale, torch.float32)
    assert ((back - x).abs() <= scale.float()[..., None] / 2 + 1e-6).all()
    assert torch.equal(kv_codes.round_trip(torch.zeros(2, 1, 4), "int8"), torch.zeros(2, 1, 4))


def test_fp8_codes_keep_three_mantissa_bits_and_saturate_instead_of_nan():
    x = torch.tensor([[[1.0, 1.0625, 300.0, 1000.0, -1e6, 1e-12]]])
    back = kv_codes.round_trip(x, "fp8")
    assert back.tolist() == [[[1.0, 1.0, 288.0, 448.0, -448.0, 0.0]]]  # 1.0625 -> 1 (3 bits); beyond 448: 448
    codes, scale = kv_codes.quantize(x, "fp8")
    assert codes.dtype is torch.uint8 and scale is None


@pytest.mark.parametrize("kv_cache_dtype, ratio_fp32, ratio_bf16", [("int8", 3.88, 1.94), ("fp8", 4.0, 2.0)])
def test_bytes_per_token(kv_cache_dtype, ratio_fp32, ratio_bf16):
    """The shipped model's heads (head_dim 64): int8 pays a float16 scale per 64 codes."""
    fp32 = kv_bytes_per_token(8, 2, 64, torch.float32)
    bf16 = kv_bytes_per_token(8, 2, 64, torch.bfloat16)
    quantized = kv_bytes_per_token(8, 2, 64, torch.float32, kv_cache_dtype)
    assert fp32 / quantized == pytest.approx(ratio_fp32, abs=0.01)
    assert bf16 / quantized == pytest.approx(ratio_bf16, abs=0.01)
    cache = PagedKVCache(8, 10, 16, 2, 64, torch.float32, kv_cache_dtype=kv_cache_dtype)
    assert cache.nbytes == 10 * 16 * quantized


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_the_reference_ops_attend_over_what_the_codes_stand_for(kv_cache_dtype):
    """store_kv then decode / prefill attention on a quantized cache equal the same on a float cache that
    holds the round-tripped K/V."""
    generator = torch.Generator().manual_seed(0)
    k, v, q = (torch.randn(10, 2, 16, generator=generator) for _ in range(3))
    q = torch.randn(10, 4, 16, generator=generator)
    slots = torch.tensor([5, 6, 7, 8, 9, 0, 1, 2, 3, 4])  # blocks 1, 2 then 0
    quantized = PagedKVCache(1, 3, 4, 2, 16, kv_cache_dtype=kv_cache_dtype)
    plain = PagedKVCache(1, 3, 4, 2, 16)
    paged_ops.store_kv(k, v, quantized.k[0], quantized.v[0], slots, **quantized.scales(0))
    paged_ops.store_kv(kv_codes.round_trip(k, kv_cache_dtype), kv_codes.round_trip(v, kv_cache_dtype), plain.k[0],
                       plain.v[0], slots)
    tables, lens = torch.tensor([[1, 2, 0]]), torch.tensor([10])
    got = paged_ops.paged_decode_attention(q[-1:], quantized.k[0], quantized.v[0], tables, lens, 0.25,
                                           **quantized.scales(0))
    expected = paged_ops.paged_decode_attention(q[-1:], plain.k[0], plain.v[0], tables, lens, 0.25)
    assert torch.equal(got, expected)
    out_q, out_p = torch.zeros_like(q), torch.zeros_like(q)
    starts = (torch.tensor([0]), torch.tensor([10]), torch.tensor([0]))
    paged_ops.paged_prefill_attention(q, quantized.k[0], quantized.v[0], tables, *starts, 0.25, out_q,
                                      **quantized.scales(0))
    paged_ops.paged_prefill_attention(q, plain.k[0], plain.v[0], tables, *starts, 0.25, out_p)
    assert torch.equal(out_q, out_p)


# -------------------------------------------------------------------------------------------------- engine
ARRIVALS = [(0, [5, 9, 13, 200, 17] * 3, 14), (0, list(range(30, 70)), 9), (2, [99, 98] * 6, 12), (1, [3, 4], 16)]


def configs(model) -> dict[str, EngineConfig]:
    base = EngineConfig(max_num_seqs=3, max_model_len=64, max_tokens_per_step=64, kv="paged", block_size=8,
                        kv_cache_bytes=1)  # replaced below: 9 blocks of this cache's bytes — preemptions happen
    return {"paged": base, "prefix": dataclasses.replace(base, prefix_cache=True),
            "chunked": dataclasses.replace(base, chunked_prefill=True, max_tokens_per_prefill_chunk=8),
            "ngram": dataclasses.replace(base, prefix_cache=True,
                                         speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3))}


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_every_configuration_gives_the_round_tripped_naive_loops_tokens(model, kv_cache_dtype):
    expected = [naive_greedy(model, prompt, n, kv_cache_dtype) for _, prompt, n in ARRIVALS]
    floats = [naive_greedy(model, prompt, n) for _, prompt, n in ARRIVALS]
    per_token = kv_bytes_per_token(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim,
                                   model.dtype, kv_cache_dtype)
    preempted = 0
    for name, config in configs(model).items():
        config = dataclasses.replace(config, kv_cache_dtype=kv_cache_dtype, kv_cache_bytes=9 * 8 * per_token)
        engine = LLMEngine(model, ByteTokenizer(), config)
        assert engine.cache.kv_cache_dtype == kv_cache_dtype and engine.pool.num_blocks == 9
        got = list(run_to_completion(engine, ARRIVALS).values())
        assert got == expected, name
        preempted += engine.num_preemptions
    assert preempted > 0
    assert expected != floats  # the codes change this random model's tokens (2 of 4 here): the test can tell


def test_the_quantized_cache_with_quantized_weights_and_a_compiled_decode_step(model):
    quantized = quantize_model(model, "int8")
    expected = [naive_greedy(quantized, prompt, n, "int8") for _, prompt, n in ARRIVALS]
    config = EngineConfig(max_num_seqs=4, max_model_len=64, max_tokens_per_step=64, kv="paged", block_size=8,
                          kv_cache_dtype="int8", compile=True, graph_batch_sizes=(4,))
    engine = LLMEngine(quantized, ByteTokenizer(), config)
    assert list(run_to_completion(engine, ARRIVALS).values()) == expected
    assert any(step.recorded_batch == 4 for step in engine.trace.steps)


@pytest.mark.parametrize("options, match", [
    (dict(kv_cache_dtype="int4", kv="paged"), "kv_cache_dtype must be one of"),
    (dict(kv_cache_dtype="fp8"), "needs kv='paged'"),
    (dict(kv_cache_dtype="int8", kv="paged", use_cpu_kernel=True), "use_cpu_kernel=True .* reads the model's dtype"),
])
def test_bad_combinations_name_the_field(options, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**options)



# -------------------------------------------------------------------------------------------------- Triton
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_the_triton_kernels_dequantize_on_load_like_the_reference(kv_cache_dtype):
    """minillm/attention/triton_paged.py on a quantized cache (interpreted here: TRITON_INTERPRET=1 from
    tests/conftest.py; compiled by scripts/gpu_check.sh): the same codes stored, the same attention read."""
    pytest.importorskip("triton")
    from minillm.attention import triton_paged

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if triton_paged.unavailable_reason(device):
        pytest.skip(triton_paged.unavailable_reason(device))
    generator = torch.Generator().manual_seed(1)
    k, v = (torch.randn(21, 2, 16, generator=generator).to(device) * 3 for _ in range(2))
    q = torch.randn(21, 4, 16, generator=generator).to(device)
    slots = torch.randperm(24, generator=generator)[:21].to(device)
    caches = [PagedKVCache(1, 6, 4, 2, 16, device=device, kv_cache_dtype=kv_cache_dtype) for _ in range(2)]
    paged_ops.store_kv(k, v, caches[0].k[0], caches[0].v[0], slots, **caches[0].scales(0))
    triton_paged.store_kv(k, v, caches[1].k[0], caches[1].v[0], slots, **caches[1].scales(0))
    for name in ("k", "v", "k_scale", "v_scale"):
        if getattr(caches[0], name) is not None:
            assert torch.equal(getattr(caches[0], name)[0], getattr(caches[1], name)[0]), name
    cache = caches[1]
    table = torch.arange(6, dtype=torch.int32, device=device)[None]  # one sequence over every block, in order
    lens = torch.tensor([int(slots.max()) + 1], dtype=torch.int32, device=device)
    got = triton_paged.paged_decode_attention(q[:1], cache.k[0], cache.v[0], table, lens, 0.25, **cache.scales(0))
    expected = paged_ops.paged_decode_attention(q[:1], cache.k[0], cache.v[0], table, lens, 0.25, **cache.scales(0))
    assert torch.allclose(got, expected, atol=1e-5)
    out_t, out_r = torch.zeros_like(q), torch.zeros_like(q)
    starts = [torch.tensor([x], dtype=torch.int32, device=device) for x in (0, 12, 4)]  # 12 queries after 4 keys
    triton_paged.paged_prefill_attention(q, cache.k[0], cache.v[0], table, *starts, 0.25, out_t, 12,
                                         **cache.scales(0))
    paged_ops.paged_prefill_attention(q, cache.k[0], cache.v[0], table, *starts, 0.25, out_r, 12, **cache.scales(0))
    assert torch.allclose(out_t, out_r, atol=1e-5)


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_the_engine_on_the_triton_kernels_gives_the_round_tripped_naive_loops_tokens(model, kv_cache_dtype):
    pytest.importorskip("triton")
    from minillm.attention import triton_paged

    if triton_paged.unavailable_reason(model.device):
        pytest.skip(triton_paged.unavailable_reason(model.device))
    arrivals = ARRIVALS[:3]
    expected = [naive_greedy(model, prompt, n, kv_cache_dtype) for _, prompt, n in arrivals]
    config = EngineConfig(max_num_seqs=3, max_model_len=64, max_tokens_per_step=64, kv="paged", block_size=8,
                          kv_cache_dtype=kv_cache_dtype, use_triton=True, prefix_cache=True)
    engine = LLMEngine(model, ByteTokenizer(), config)
    assert engine.cache.ops is triton_paged
    assert list(run_to_completion(engine, arrivals).values()) == expected
