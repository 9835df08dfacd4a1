"""Weight-only quantization (chapter 12): the formats round-trip within their step, the CPU kernels equal
the dequantize-then-multiply reference, a quantized model leaves the float one untouched, and every engine
configuration reproduces the naive loop run on the *same quantized* model, token for token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.generate import generate_without_cache
from minillm.quantization import (
    Int4Linear,
    Int8Linear,
    quantization_of,
    quantize_int4,
    quantize_int8,
    quantize_model,
    weight_bytes,
)
from minillm.quantization.formats import pack_int4, quantize_per_tensor_int8, unpack_int4
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from tests.test_engine import paged_budget, run_to_completion


def weights(n: int = 48, k: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ formats
def test_int8_codes_are_within_half_a_step_of_each_weight():
    w = weights()
    q = quantize_int8(w)
    assert q.q.dtype is torch.int8 and q.q.abs().max() == 127 and q.scale.shape == (48,)
    assert ((q.dequantize() - w).abs() <= q.scale[:, None] / 2 + 1e-6).all()
    assert torch.equal(quantize_int8(torch.zeros(2, 8)).dequantize(), torch.zeros(2, 8))  # a zero row: no NaN


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_groups_cover_each_groups_range(group_size):
    w = weights()
    q = quantize_int4(w, group_size)
    assert q.packed.shape == (48, 64) and q.scale.shape == (48, 128 // group_size)
    assert q.q.min() >= 0 and q.q.max() <= 15
    step = q.scale.repeat_interleave(group_size, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-5).all()
    grouped = w.view(48, -1, group_size)  # each group's extremes are codes 0 and 15, exactly
    assert torch.allclose(q.minimum, grouped.amin(-1)) and torch.allclose(q.scale * 15 + q.minimum, grouped.amax(-1))


def test_int4_packing_round_trips_with_the_even_input_low():
    codes = torch.randint(0, 16, (5, 12), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (5, 6) and torch.equal(packed[:, 0], codes[:, 0] | (codes[:, 1] << 4))
    assert torch.equal(unpack_int4(packed), codes)


def test_one_outlier_ruins_a_per_tensor_scale_not_a_per_channel_one():
    w = weights()
    w[3, 7] = 60.0  # one weight 20x the rest
    per_tensor = (quantize_per_tensor_int8(w) - w).pow(2).mean()
    per_channel = (quantize_int8(w).dequantize() - w).pow(2).mean()
    assert per_tensor > 20 * per_channel  # ~37x here: every other row pays for the outlier's range


@pytest.mark.parametrize("bad", [16, 48, 256, True, "64"])
def test_a_group_size_the_kernels_do_not_take_is_refused(bad):
    with pytest.raises(ValueError, match="quantization_group_size"):
        quantize_int4(weights(), bad)


def test_a_group_size_that_does_not_divide_the_inputs_is_refused():
    with pytest.raises(ValueError, match="does not divide a layer's 96 inputs"):
        quantize_int4(weights(k=96), 64)


# ------------------------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_cpu_kernels_equal_dequantize_then_multiply(scheme, dtype):
    w, bias = weights(96, 128), torch.randn(96)
    layer = Int8Linear(quantize_int8(w), bias) if scheme == "int8" else Int4Linear(quantize_int4(w, 32), bias)
    reference = quantize_int8(w).dequantize() if scheme == "int8" else quantize_int4(w, 32).dequantize()
    # int4 reads it back through the kernel, which computes (q - 8) * scale + zero: equal to float rounding
    assert torch.allclose(layer.dequantize(), reference, atol=1e-6, rtol=0)
    for rows in (1, 5, 33):
        x = torch.randn(rows, 128).to(dtype)
        got = layer(x)
        assert got.dtype is dtype and got.shape == (rows, 96)
        # the kernels take bfloat16 activations (their fast path), whatever the model's dtype: exactly what the
        # reference gives on x rounded to bfloat16, to the kernel's bfloat16 output rounding
        expected = x.bfloat16().float() @ reference.T + bias
        assert torch.allclose(got.float(), expected, atol=0.01 * expected.abs().max(), rtol=0)
        exact = x.float() @ reference.T + bias
        assert (got.float() - exact).norm() / exact.norm() < 0.01  # and within 1% of the float32 product
    assert layer(torch.randn(2, 3, 128)).shape == (2, 3, 96)
    assert layer(torch.randn(0, 128)).shape == (0, 96)


def test_float16_takes_the_reference_path():
    w = weights(64, 64)
    layer = Int4Linear(quantize_int4(w, 32))
    x = torch.randn(3, 64)
    expected = x.half().float() @ quantize_int4(w, 32).dequantize().T
    assert torch.allclose(layer(x.half()).float(), expected, rtol=0.002, atol=0.01)  # float16's own rounding


# ------------------------------------------------------------------------------------------------ model
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantizing_a_model_leaves_it_untouched_and_shares_what_it_keeps(model, scheme):
    before = {name: p.clone() for name, p in model.state_dict().items()}
    quantized = quantize_model(model, scheme, 32)
    assert quantization_of(model) is None and quantization_of(quantized) in ("int8", "int4 (group 32)")
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    assert quantized.embed_tokens.weight is model.embed_tokens.weight
    assert quantized.layers[0].input_layernorm.weight is model.layers[0].input_layernorm.weight
    layer = quantized.layers[0].self_attn.qkv_proj
    assert isinstance(layer, Int8Linear if scheme == "int8" else Int4Linear)
    assert (layer.bias is None) == (model.layers[0].self_attn.qkv_proj.bias is None)
    float_bytes, small = weight_bytes(model)["linear layers"], weight_bytes(quantized)["linear layers"]
    assert small < float_bytes / (3.5 if scheme == "int8" else 5)
    with pytest.raises(ValueError, match="quantized already"):
        quantize_model(quantized, scheme, 32)


def test_a_group_size_that_does_not_divide_a_layer_names_the_field(model):
    with pytest.raises(ValueError, match="quantization_group_size 64 does not divide a layer's 96 inputs"):
        quantize_model(model, "int4", 64)  # the tiny model's down_proj has 96 inputs


@pytest.mark.parametrize("field, value, match", [
    ("quantization", "int3", "quantization must be one of"),
    ("quantization", "INT8", "quantization must be one of"),
    ("quantization_group_size", 48, "quantization_group_size must be one of"),
    ("quantization_group_size", None, "quantization_group_size must be one of"),
])
def test_unknown_schemes_and_group_sizes_are_refused_by_the_config(field, value, match):
    options = {"quantization": "int4", field: value}
    with pytest.raises(ValueError, match=match):
        EngineConfig(**options)


def test_an_engine_refuses_a_model_quantized_otherwise(model):
    with pytest.raises(ValueError, match=r"quantized as int8, the config asks for int4 \(group 32\)"):
        LLMEngine(quantize_model(model, "int8"), ByteTokenizer(),
                  EngineConfig(quantization="int4", quantization_group_size=32))


# ------------------------------------------------------------------------------------------------ engine
ARRIVALS = [(0, [5, 9, 13, 200, 17], 12), (0, list(range(30, 70)), 9), (2, [99] * 11, 14), (1, [3, 4], 7)]


def configs(model, block_size: int = 8) -> dict[str, EngineConfig]:
    base = EngineConfig(max_num_seqs=3, max_model_len=64, max_tokens_per_step=64)
    paged = dataclasses.replace(base, kv="paged", block_size=block_size,
                                kv_cache_bytes=paged_budget(model, block_size, 12))  # tight: preemptions
    return {"static": dataclasses.replace(base, batching="static"), "continuous": base, "paged": paged,
            "paged+prefix": dataclasses.replace(paged, prefix_cache=True),
            "chunked": dataclasses.replace(paged, chunked_prefill=True, max_tokens_per_prefill_chunk=8),
            "ngram": dataclasses.replace(paged, speculative=SpeculativeConfig(method="ngram",
                                                                              num_speculative_tokens=3))}


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_every_configuration_gives_the_quantized_naive_loops_tokens(model, scheme):
    quantized = quantize_model(model, scheme, 32)

    def reference(prompt, n):
        params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
        return generate_without_cache(quantized, ByteTokenizer(), prompt, params).token_ids

    expected = [reference(prompt, n) for _, prompt, n in ARRIVALS]
    floats = [generate_without_cache(model, ByteTokenizer(), prompt, SamplingParams(
        temperature=0, max_new_tokens=n, ignore_eos=True)).token_ids for _, prompt, n in ARRIVALS]
    assert expected != floats or scheme == "int8"  # int4 changes this random model's tokens: the test can tell
    for name, config in configs(model).items():
        for given, options in ((model, dict(quantization=scheme, quantization_group_size=32)), (quantized, {})):
            engine = LLMEngine(given, ByteTokenizer(), dataclasses.replace(config, **options))
            assert quantization_of(engine.model) == quantization_of(quantized)
            got = list(run_to_completion(engine, ARRIVALS).values())
            assert got == expected, name


# ------------------------------------------------------------------------------------------------ Triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_the_triton_kernel_equals_dequantize_then_multiply(scheme, dtype):
    """The CUDA kernel of minillm/quantization/triton_matmul.py, in Triton's interpreter here (TRITON_INTERPRET=1,
    set by tests/conftest.py) and compiled by scripts/gpu_check.sh: ragged shapes, every tile edge masked."""
    pytest.importorskip("triton")
    from minillm.quantization import triton_matmul

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if triton_matmul.unavailable_reason(device):
        pytest.skip(triton_matmul.unavailable_reason(device))
    w = weights(72, 160).to(device)  # N = 72: not a multiple of 32; K = 160: five K tiles
    for rows in (1, 17):
        x = torch.randn(rows, 160, device=device).to(dtype)
        if scheme == "int8":
            q = quantize_int8(w)
            got, weight = triton_matmul.int8_matmul(x, q.q, q.scale), q.dequantize()
        else:
            q = quantize_int4(w, 32)
            got, weight = triton_matmul.int4_matmul(x, q.packed, q.scale, q.minimum, 32), q.dequantize()
        expected = torch.nn.functional.linear(x.float(), weight)
        assert got.dtype is dtype and got.shape == (rows, 72)
        tolerance = 1e-4 if dtype is torch.float32 else 0.02
        assert torch.allclose(got.float(), expected, atol=tolerance * expected.abs().max(), rtol=0)
    with pytest.raises(ValueError, match="x must be"):
        triton_matmul.int8_matmul(torch.randn(2, 3, device=device), quantize_int8(w).q, quantize_int8(w).scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh runs it)")
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_on_cuda_the_engine_runs_the_triton_kernel_and_gives_the_quantized_naive_loops_tokens(model, scheme):
    import copy

    cuda_model = copy.deepcopy(model).to("cuda")  # the session's model stays on the CPU
    quantized = quantize_model(cuda_model, scheme, 32)
    assert all(buffer.is_cuda for buffer in quantized.layers[0].mlp.down_proj.buffers())
    expected = [generate_without_cache(quantized, ByteTokenizer(), prompt, SamplingParams(
        temperature=0, max_new_tokens=n, ignore_eos=True)).token_ids for _, prompt, n in ARRIVALS]
    config = EngineConfig(max_num_seqs=3, max_model_len=64, max_tokens_per_step=64, kv="paged", block_size=8,
                          kv_cache_bytes=paged_budget(cuda_model, 8, 12))
    engine = LLMEngine(quantized, ByteTokenizer(), config)
    assert list(run_to_completion(engine, ARRIVALS).values()) == expected


COMPILE_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minillm.quantization import triton_matmul

fn = triton_matmul._quantized_matmul_kernel
for x, int4 in [("fp32", False), ("bf16", False), ("fp16", True), ("bf16", True)]:
    types = {"x_ptr": "*" + x, "out_ptr": "*" + x, "codes_ptr": "*u8" if int4 else "*i8", "scale_ptr": "*fp32",
             "minimum_ptr": "*fp32"}
    constants = {"INT4": int4, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "UPCAST": False,
                 "PRECISION": "ieee" if x == "fp32" else "tf32"}
    signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in fn.arg_names}
    assert triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32)).asm["cubin"]
    print(x, "int4" if int4 else "int8", "compiled")
"""


def test_the_triton_kernel_compiles_for_a_gpu_target(tmp_path):
    """Down to a cubin for sm_90 (no GPU needed): what the interpreter lets through, the compiler may not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("this triton build has no NVIDIA backend")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout.split("\n")[:4] == ["fp32 int8 compiled", "bf16 int8 compiled", "fp16 int4 compiled",
                                             "bf16 int4 compiled"]
