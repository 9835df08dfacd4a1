"""Chapter 8's live experiments hold or warn under load, their words follow their numbers, and both
outcomes are worded. Nothing here compiles (torch.compile takes ~15 s per shape on a laptop CPU):
the recorded engine runs the same static, padded step eagerly, through the same runner path."""

from __future__ import annotations

import pytest

import minillm
from experiments.ch08 import (
    Served,
    describe_padding,
    describe_recorded,
    launch_profiles,
    padding_cost,
    recorded_vs_eager,
    step_anatomy,
)
from minillm import EngineConfig
from minillm.engine import LLMEngine
from minillm.graphs.recorded_decode import RecordedDecode
from minillm.timing import CpuUse, Trials
from tests.cpu_hog import cpu_hog


@pytest.fixture(scope="module")
def shipped():
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    prompts = [text[40 * i : 40 * i + 32] for i in range(4)]
    return model, tokenizer, prompts


def _engines(model, tokenizer) -> tuple[LLMEngine, LLMEngine]:
    eager = LLMEngine(model, tokenizer, EngineConfig(kv="paged", max_num_seqs=4, max_model_len=128))
    static = LLMEngine(model, tokenizer, EngineConfig(kv="paged", max_num_seqs=4, max_model_len=128, compile=True,
                                                      graph_batch_sizes=(1, 4)))
    recorded = static.runner.recorded  # the compiled engine's path, run eagerly: no compile time here
    static.runner.recorded = RecordedDecode(model, static.cache, recorded.buckets, "eager", recorded.width)
    return eager, static


def _all(model, tokenizer, prompts, batches=(1, 3), new_tokens=3):
    """Each experiment of the chapter, small (2 rounds, new_tokens - 1 decode steps a run)."""
    eager, static = _engines(model, tokenizer)
    return [step_anatomy(eager, prompts[0], rounds=2, new_tokens=new_tokens, warm_steps=2),
            padding_cost(eager, prompts, batch=3, bucket=4, rounds=2, new_tokens=new_tokens, warmup=False),
            recorded_vs_eager(eager, static, prompts, batches=batches, rounds=2, new_tokens=new_tokens, label="static"),
            launch_profiles({"eager": eager, "static": static}, prompts[0], rounds=2, warm_steps=2)]


def test_under_a_cpu_hog_each_finding_holds_or_the_guard_fires(shipped):
    """With torch's threads as the notebook has them (every core): the recorded engine here is not compiled,
    so its claim to be faster need not hold, and the guard must fire; with one thread the hog would leave a
    spare core and the guard might stay silent on a run that merely came out either way."""
    with cpu_hog():
        findings = _all(*shipped, batches=(3,), new_tokens=2)
    for finding in findings:
        assert finding.warning or finding.holds, finding.text


def test_the_words_are_the_numbers(shipped):
    anatomy, padding, recorded, profiles = _all(*shipped)
    n = anatomy.numbers
    assert f"{n['step_s'] * 1e3:.2f} ms" in anatomy.text and f"{n['matmul_s'] * 1e3:.2f} ms" in anatomy.text
    assert f"the {n['num_ops']} operators" in anatomy.text or not anatomy.holds
    n = padding.numbers
    assert all(f"{s * 1e3:.2f} ms" in padding.text for s in n["step_s"].values())
    assert f"{n['growth']:.2f}x the time of 3" in padding.text and "25% of the rows" in padding.text
    for row in recorded.numbers["rows"]:
        assert f"{row['eager_s'] * 1e3:.2f} ms eager, {row['recorded_s'] * 1e3:.2f} ms static" in recorded.text
        assert f"{row['speedup'].value:.2f}x" in recorded.text
    assert "3 requests (padded to 4)" in recorded.text and recorded.numbers["same_tokens"]
    assert f"Same tokens as the eager engine in every run: {recorded.numbers['same_tokens']}" in recorded.text
    for label, profile in profiles.numbers["profiles"].items():
        assert f"{label} {profile.num_host_ops}" in profiles.text and f"{profile.wall_us / 1e3:.2f} ms" in profiles.text


def _trials(results: dict[str, list], busy: bool = False) -> Trials:
    cpu = CpuUse(wall_s=1.0, ours_s=2.0, others_s=2.0 if busy else 0.0, cores=2, threads=2)
    return Trials(results, cpu)


def _served(seconds: float) -> Served:
    return Served([[1, 2]], seconds, 10)


def test_padding_is_worded_both_ways():
    memory_bound = describe_padding(_trials({"1 request": [_served(3e-3)] * 2, "9 requests": [_served(4e-3)] * 2,
                                             "16 requests": [_served(5e-3), _served(5.16e-3)]}), 9, 16)
    assert memory_bound.holds and memory_bound.warning is None
    assert "1.27x the time of 9" in memory_bound.text and "cost about 21% of the padded step's time, not 44%" \
        in memory_bound.text
    no_cost = describe_padding(_trials({"1 request": [_served(3e-3)] * 2, "9 requests": [_served(4e-3)] * 2,
                                        "16 requests": [_served(3.9e-3)] * 2}), 9, 16)
    assert no_cost.holds and "cost no share these runs could see" in no_cost.text  # never a negative share
    compute_bound = describe_padding(_trials({"1 request": [_served(1e-3)] * 2, "9 requests": [_served(9e-3)] * 2,
                                              "16 requests": [_served(16e-3), _served(17e-3)]}), 9, 16)
    assert not compute_bound.holds and "grew with its rows" in compute_bound.text
    assert compute_bound.warning is None  # a quiet machine, and rounds that agree: the claim simply failed here


def test_a_recorded_step_that_is_not_faster_is_said_so_and_warns_when_the_machine_was_busy():
    trials = _trials({"eager, 1": [_served(3e-3)] * 2, "compiled, 1": [_served(2e-3), _served(4e-3)]}, busy=True)
    finding = describe_recorded(trials, [1], [1, 4], "compiled")
    assert not finding.holds and "not faster in every round" in finding.text
    assert "other programs kept 2.0 of this machine's 2 cores busy" in finding.warning


def test_what_recording_removed_is_worded_for_each_outcome():
    from experiments import Finding
    from experiments.ch08 import what_recording_removed

    anatomy = Finding("", True, {"step_s": 3e-3, "matmul_s": 2e-3})
    saved = lambda s: Finding("", True, {"saving_s": s})  # noqa: E731
    assert "50% of the 1.00 ms" in what_recording_removed(anatomy, saved(0.5e-3))
    assert "more than the 1.00 ms" in what_recording_removed(anatomy, saved(1.5e-3))
    assert "saved nothing measurable here (-0.10 ms" in what_recording_removed(anatomy, saved(-0.1e-3))
