"""Chapter 6's live experiments hold or warn under load, their words follow their numbers, and the
step-cost model counts what a step runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.ch06 import (
    StepCost,
    budgets,
    chosen_chunk,
    chunk_sweep,
    chunked,
    fit_steps,
    saved_benchmark_words,
    serve,
    stall,
    step_work,
    workload,
)
from tests.cpu_hog import cpu_hog

SAVED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "chunked_prefill.json"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/experiments/conftest.py


@pytest.fixture(scope="module")
def work():
    """Small, so that each run takes a fraction of a second: four decoders, a 192-token prompt after 4 steps."""
    return workload(num_decoders=4, prompt_len=192, decode_tokens=16, long_arrives_at=4)


def test_a_chunks_pairs_are_counted_from_where_it_starts(work):
    run = serve(chunked(80), work)
    steps = run.trace.steps
    chunks = [(s, steps[i - 1]) for i, s in enumerate(steps) if "long" in s.prefill_tokens]
    assert [s.prefill_tokens["long"] for s, _ in chunks] == [80, 80, 32]
    decode_pairs = [sum(s.kv_tokens[d] for d in ("0", "1", "2", "3")) for s, _ in chunks]
    assert [step_work(s, before)[0] for s, before in chunks] == [84, 84, 36]
    prompt_pairs = [step_work(s, before)[1] - c for (s, before), c in zip(chunks, decode_pairs)]
    assert prompt_pairs == [80 * 81 // 2, 80 * 80 + 80 * 81 // 2, 160 * 32 + 32 * 33 // 2]
    assert sum(prompt_pairs) == 192 * 193 // 2  # the prompt's pairs, however it is cut


def test_prompt_steps_follow_the_model():
    cost = StepCost(1.0, 0.5, 0.25)
    # chunks of 2 of a 3-token prompt beside decodes at contexts 10 and 20 (then 11 and 21)
    assert cost.prompt_steps([10, 20], 3, 2) == [1 + 0.5 * 4 + 0.25 * (30 + 3), 1 + 0.5 * 3 + 0.25 * (32 + 2 + 1)]
    assert cost.prompt_steps([], 3, 8) == [1 + 0.5 * 3 + 0.25 * 6]


def test_the_fit_recovers_a_model_and_sets_aside_a_disturbed_step():
    truth = StepCost(0.008, 0.0002, 1e-7)
    work = [(8, 300), (8, 600), (40, 2000), (136, 9000), (136, 170000), (520, 400000), (1508, 1126000), (192, 2400)]
    seconds = [truth.time(*w) for w in work]
    seconds[1] *= 5  # a step slowed by something else
    cost, kept = fit_steps(work, seconds)
    assert kept == [True, False, True, True, True, True, True, True]
    assert cost == pytest.approx(truth, rel=1e-6)


def test_under_a_cpu_hog_the_sweep_holds_or_the_guard_fires(work):
    with cpu_hog():
        finding = chunk_sweep(work, sizes=(32,), rounds=2)
    assert finding.warning or finding.holds, finding.text


def test_under_a_cpu_hog_the_stall_shows_or_the_guard_fires(work):
    with cpu_hog():
        finding = stall(work, rounds=2)
    assert finding.warning or finding.holds, finding.text


def test_under_a_cpu_hog_the_budget_holds_or_the_guard_fires():
    two = workload(num_decoders=4, prompt_len=192, decode_tokens=16, long_arrives_at=4, num_long=2)
    with cpu_hog():
        finding = budgets(two, budgets=(8192, 132), rounds=2)
    assert finding.warning or finding.holds, finding.text


def test_under_a_cpu_hog_the_chosen_chunk_keeps_its_target_or_the_guard_fires(work):
    cost = StepCost(0.008, 0.0002, 1e-7)
    with cpu_hog():
        finding = chosen_chunk(work, 32, cost.time(36, 40_000), cost, rounds=2)
    assert finding.warning or finding.holds, finding.text


def test_the_words_are_the_numbers(work):
    finding = chunk_sweep(work, sizes=(32,), rounds=2)
    rows = finding.numbers["rows"]
    for name in ("unchunked", "chunks of 32"):
        assert f"{rows[name]['itl_p99_s'] * 1e3:.0f} ms" in finding.text
        assert f"{rows[name]['ttft_s'] * 1e3:.0f} ms" in finding.text
    assert (f"{finding.numbers['itl_p99_ratio'].value:.1f}x shorter" in finding.text) == finding.holds
    assert all(f"{r:.2f}x" in finding.text for r in finding.numbers["ttft_ratio"].per_round)


def test_the_saved_benchmark_is_described_from_its_numbers():
    saved = json.loads(SAVED.read_text())
    words = saved_benchmark_words(saved)
    plain = saved["rows"]["unchunked"]
    assert f"{plain['itl_p99_s'] * 1e3:.0f} ms" in words and f"{plain['output_tok_per_s']:.0f} unchunked" in words
    assert f"{saved['ratios']['itl_p99_unchunked_vs_chunked']:.1f}x lower" in words
    # a run where a chunked prompt came first is not described as the long prompts paying
    swapped = json.loads(SAVED.read_text())
    swapped["rows"]["chunk 512"]["long_prompt_ttft_p50_s"] = 0.5 * plain["long_prompt_ttft_p50_s"]
    assert "long prompts pay" not in saved_benchmark_words(swapped)
