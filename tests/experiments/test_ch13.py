"""Chapter 13's experiments: real models' sizes computed from their shapes, a real layer split exactly as
the engine splits it, the engine's runs at several sizes (and the busy flag under a CPU hog), the link
estimates, and the saved benchmarks' words."""

from __future__ import annotations

import pytest
import torch

import minillm
from experiments import ch13
from tests.cpu_hog import cpu_hog

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_real_models_parameters_come_out_of_their_shapes():
    counts = {s.name: s.parameters for s in ch13.REAL_MODELS}
    assert counts["Llama-3.1-8B"] == pytest.approx(8.03e9, rel=1e-3)  # the published 8.03 B
    assert counts["Llama-3.1-70B"] == pytest.approx(70.55e9, rel=1e-3)
    assert counts["Llama-3.1-405B"] == pytest.approx(405.85e9, rel=1e-3)
    rows = {r[0]: r for r in ch13.memory_table(gpu_gb=80, context=32768)}
    assert rows["Llama-3.1-70B"][3:7] == ["320 KiB", "10.7 GB", "2", "0"] and rows["Llama-3.1-405B"][5] == "16"


def test_a_real_layer_split_needs_exactly_its_one_sum():
    mlp = minillm.load_model().layers[2].mlp
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    for size in (2, 4):
        d = ch13.split_layer(mlp, x, size)
        assert d["columns side by side vs whole"] == 0.0
        assert d["partial sums summed vs whole"] < 1e-5
        assert d["one partial alone vs whole"] > 100 * d["partial sums summed vs whole"] + 0.01


def test_head_placement_replicates_kv_heads_past_their_count():
    rows = ch13.head_placement(minillm.load_model().config, sizes=(4,))
    assert [r[3] for r in rows] == ["0-0 (replicated)", "0-0 (replicated)", "1-1 (replicated)", "1-1 (replicated)"]


def test_the_links_estimate_grows_with_slower_links_and_larger_batches():
    llama70 = next(s for s in ch13.REAL_MODELS if s.name == "Llama-3.1-70B")
    small, large = ch13.link_table(llama70, 8, 1), ch13.link_table(llama70, 8, 64)
    shares = [float(r[4].rstrip("%")) for r in large]
    assert shares == sorted(shares) and shares[0] < 50 < shares[-1]
    assert all(float(s[2].split()[0]) < float(b[2].split()[0]) for s, b in zip(small, large))


def test_engine_runs_equal_across_sizes_and_flag_a_busy_machine(model):
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    quiet = ch13.tp_runs(model, prompts, 6, sizes=(1, 2), max_num_seqs=2, max_model_len=64)
    assert quiet[0].tokens == quiet[1].tokens and quiet[1].records is not None
    assert quiet[1].allreduce[0] > 0 and quiet[1].weight_bytes < quiet[0].weight_bytes
    with cpu_hog():
        (busy,) = ch13.tp_runs(model, prompts, 6, sizes=(2,), max_num_seqs=2, max_model_len=64)
    assert busy.busy and busy.tokens == quiet[0].tokens


def test_the_saved_words_follow_whatever_the_benchmark_holds():
    saved = {"meta": {"machine": "x86_64"}, "rows": {"disaggregated": {
        "kv_blocks_per_long_prompt": 62, "kv_bytes_per_long_prompt": 8 << 20, "kv_receive_ms_p50": 6.5}},
        "ratios": {"repeats": 3, "itl_p99_unchunked_vs_disaggregated": 5.0, "itl_p99_chunked_vs_disaggregated": 0.8,
                   "itl_p50_disaggregated_vs_unchunked": 1.3, "long_prompt_ttft_disaggregated_vs_unchunked": 2.0}}
    words = ch13.disaggregation_words(saved)
    assert "5.0x lower than on one unchunked engine and 1.2x higher than with chunked prefill" in words
    assert "62 blocks (8.0 MiB)" in words and "2.00x the unchunked engine's" in words
    if ch13.saved("disaggregation") is not None:  # the course's own file, whatever it holds
        assert ch13.disaggregation_words(ch13.saved("disaggregation"))
