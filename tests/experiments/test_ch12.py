"""Chapter 12's experiments: the schemes quantize as they say, the engine runs they time hold or warn under
load, the capacity run counts what the engine did, and the saved benchmark's words follow whatever it holds."""

from __future__ import annotations

import json

import pytest
import torch

import minillm
from experiments import ch12
from minillm import EngineConfig
from minillm.engine import LLMEngine
from minillm.quantization import quantize_int4, quantize_int8, quantize_model
from tests.cpu_hog import cpu_hog

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def shipped():
    return minillm.load_model(), minillm.load_tokenizer()


def test_the_chapters_schemes_agree_with_the_engines_formats():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(ch12.quantize(w, ch12.Scheme(8, "channel")), quantize_int8(w).dequantize(), atol=1e-6)
    assert torch.allclose(ch12.quantize(w, ch12.Scheme(4, "group", 64, symmetric=False)),
                          quantize_int4(w, 64).dequantize(), atol=1e-5)
    assert ch12.Scheme(4, "group", 64, symmetric=False).bytes_per_weight((32, 128)) == 0.5 + 8 / 64
    assert ch12.Scheme(8, "tensor").bytes_per_weight((32, 128)) == pytest.approx(1 + 4 / (32 * 128))


def test_the_number_formats_come_from_torch():
    rows = {row[0]: row for row in ch12.number_formats()}
    assert rows["fp8 e4m3"][2] == "448" and rows["bfloat16"][3] == "0.00781" and rows["float32"][1] == "32"


def test_the_decode_speed_holds_or_the_guard_fires_under_a_cpu_hog(shipped):
    model, tokenizer = shipped
    engines = {name: LLMEngine(net, tokenizer, EngineConfig(max_num_seqs=4, kv="paged", max_model_len=128))
               for name, net in (("fp32", model), ("int8", quantize_model(model, "int8")))}
    with cpu_hog():
        finding = ch12.decode_speed(engines, tokenizer.encode("ROMEO:"), batches=(1, 4), tokens=6, rounds=2)
    rows = finding.numbers["rows"]
    assert [r[:2] for r in rows] == [["fp32", "1"], ["int8", "1"], ["fp32", "4"], ["int8", "4"]]
    assert rows[0][3] == "1.00x" and rows[1][3].endswith("x") and "int8 at batch 4" in finding.text
    assert finding.warning is not None or finding.trials.trustworthy
    assert [r.num for r in finding.trials.checked] == ["int8 @1"]  # batch 4's ratio is reported, not judged


def test_kv_capacity_counts_the_requests_the_engine_ran_at_once(shipped):
    model, tokenizer = shipped
    prompts = [tokenizer.encode("ROMEO: ") * 10] * 6  # ~60 tokens each
    plain, out_plain = ch12.kv_capacity(model, tokenizer, "auto", 8192 * 16 * 10, prompts, 8)  # 10 blocks of fp32
    small, out_small = ch12.kv_capacity(model, tokenizer, "int8", 8192 * 16 * 10, prompts, 8)
    assert plain.bytes_per_token == 8192 and small.bytes_per_token == 2112 and small.blocks == 38
    assert plain.peak_running < small.peak_running <= 6
    assert len(out_plain) == len(out_small) == 6 and all(len(o) == 8 for o in out_small)


def test_the_saved_words_follow_whatever_the_benchmark_holds():
    saved = {"machine": "x86_64, 2 cores", "rounds": 3,
             "quality": {"fp32": {"perplexity_ratio": 1.0}, "int8": {"perplexity_ratio": 1.0004}},
             "speed": {"1": {"rows": {"fp32": {"vs_fp32": 1.0}, "int8": {"vs_fp32": 0.81}}}},
             "kv": {"budget_bytes": 4 << 20, "caches": {"int8": {"tokens_in_budget": 1984,
                                                                  "peak_concurrent_requests": 8}}}}
    words = ch12.saved_words(saved)
    assert "int8 +0.04%" in words and "batch 1 against fp32's: int8 0.81x" in words
    assert "KV cache in 4 MiB: int8 1,984 tokens, at most 8 requests at once" in words and "batch 16" not in words
    path = ch12.RESULTS / "quantization.json"
    if path.exists():  # the course's own file, whatever it holds
        assert ch12.saved_words(json.loads(path.read_text()))
