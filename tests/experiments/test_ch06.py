"""Chapter 6's live experiments hold or warn under load, their words follow their numbers, and the
step-cost model counts what a step runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.ch06 import (
    StepCost,
    budgets,
    carried_warning,
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
        # the cost is made up, not this machine's: a target of 10x its step leaves room for a slower machine
        finding = chosen_chunk(work, 32, 10 * cost.time(36, 40_000), cost, rounds=2)
    assert finding.warning or finding.holds, finding.text


def test_the_words_are_the_numbers(work):
    finding = chunk_sweep(work, sizes=(32,), rounds=2)
    rows = finding.numbers["rows"]
    for name in ("unchunked", "chunks of 32"):
        assert f"{rows[name]['itl_p99_s'] * 1e3:.0f} ms" in finding.text
        assert f"{rows[name]['ttft_s'] * 1e3:.0f} ms" in finding.text
    assert (f"{finding.numbers['itl_p99_ratio'].value:.1f}x shorter" in finding.text) == finding.numbers["traded"]
    assert all(f"{r:.2f}x" in finding.text for r in finding.numbers["ttft_ratio"].per_round)
    # the table's rows are one round each, the round cells 14 and 16 replay (a walk saw them disagree)
    for name, run in finding.numbers["runs"].items():
        assert rows[name]["longest_step_s"] == run.longest_step and rows[name]["itl_p99_s"] == run.itl_p99
    # the longest step's order against the chunk is checked, and a break named (a walk saw one go unsaid)
    assert all(f"{name} {rows[name]['longest_step_s'] * 1e3:.0f} ms" in finding.text for name in rows)
    assert ("broke the order" in finding.text) == bool(finding.numbers["order_broken"])
    assert finding.holds == (finding.numbers["traded"] and not finding.numbers["order_broken"])
    assert "If no warning follows" not in finding.text


def test_a_replayed_run_carries_the_warning_of_its_rounds():
    from experiments import Finding
    from minillm.timing import CpuUse, Trials

    use = lambda others: CpuUse(wall_s=1.0, ours_s=1.0, others_s=others, cores=2, threads=2)  # noqa: E731
    quiet = Trials({"a": [1.0, 1.0]}, use(0.0), "the sweep's cell")
    assert carried_warning(Finding("", True, {}, quiet), "These steps") is None
    busy = Trials({"a": [1.0, 1.0]}, use(1.5), "the sweep's cell")
    note = carried_warning(Finding("", True, {}, busy), "These steps")
    assert note.startswith("⚠ These steps come from runs measured while other work was running")
    assert "Once the machine is quiet, rerun the sweep's cell." in note


def test_the_saved_benchmark_is_described_from_its_numbers():
    saved = json.loads(SAVED.read_text())
    words = saved_benchmark_words(saved)
    plain = saved["rows"]["unchunked"]
    assert f"{plain['itl_p99_s'] * 1e3:.0f} ms" in words and f"{plain['output_tok_per_s']:.0f} unchunked" in words
    assert f"{saved['ratios']['itl_p99_unchunked_vs_chunked']:.1f}x lower" in words
    # a chunk size that came first in every repeat is a CPU's cache at work, not a disturbed run; one whose
    # repeats disagree is noise; one later in every repeat paid for its extra steps
    swapped = json.loads(SAVED.read_text())
    for k, run in enumerate(swapped["runs"]["chunk 512"]):
        run["long_prompt_ttft_p50_s"] = 0.5 * swapped["runs"]["unchunked"][k]["long_prompt_ttft_p50_s"]
    for k, run in enumerate(swapped["runs"]["chunk 256"]):
        ratio = (0.9, 1.1, 1.2)[k % 3]
        run["long_prompt_ttft_p50_s"] = ratio * swapped["runs"]["unchunked"][k]["long_prompt_ttft_p50_s"]
    for c in (32, 64, 128):
        for k, run in enumerate(swapped["runs"][f"chunk {c}"]):
            run["long_prompt_ttft_p50_s"] = 2 * swapped["runs"]["unchunked"][k]["long_prompt_ttft_p50_s"]
    words = saved_benchmark_words(swapped)
    assert "long prompts pay" not in words and "disturbed" not in words
    assert "Chunks of 512 reached it sooner than unchunked in each of the 3 repeats" in words
    assert "For chunks of 256 the repeats disagreed" in words and "x0.90, x1.10, x1.20" in words
    assert "Chunks of 32, 64 and 128 paid for their extra steps" in words
    for size in swapped["runs"]:
        if size != "unchunked":
            for run in swapped["runs"][size]:
                run["long_prompt_ttft_p50_s"] = 3.0
    assert "The long prompts pay: every chunk size" in saved_benchmark_words(swapped)
