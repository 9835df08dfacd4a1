"""Chapter 8's live experiments hold or warn under load, their words follow their numbers, and both
outcomes are worded. Nothing here compiles (torch.compile takes ~15 s per shape on a laptop CPU):
the recorded engine runs the same static, padded step eagerly, through the same runner path."""

from __future__ import annotations

import re

import pytest

import minillm
from experiments import Finding
from experiments.ch08 import (
    Served,
    describe_anatomy,
    describe_padding,
    describe_profiles,
    describe_recorded,
    launch_profiles,
    padding_cost,
    profiler_stretch,
    recorded_vs_eager,
    step_anatomy,
    what_recording_removed,
)
from minillm import EngineConfig
from minillm.engine import LLMEngine
from minillm.graphs.recorded_decode import RecordedDecode
from minillm.graphs.step_profile import Span, StepProfile
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
    assert all(f"{s * 1e3:.2f} ms" in padding.text for s in n["step_s"].values()) and "25% of the rows" in padding.text
    assert n["unclear"] or f"{n['growth']:.2f}x the time of 3" in padding.text  # an unclear run may quote it too
    assert ("cannot tell" in padding.text) == n["unclear"]
    for row in recorded.numbers["rows"]:
        assert f"{row['eager_s'] * 1e3:.2f} ms eager, {row['recorded_s'] * 1e3:.2f} ms static" in recorded.text
        assert f"{row['speedup']:.2f}x in round {row['round']}" in recorded.text
        assert row["speedup"] == pytest.approx(row["eager_s"] / row["recorded_s"])
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
    assert "1.25x the time of 9 (5.00 / 4.00 ms" in memory_bound.text and "round's two runs: 1.25x, 1.29x" \
        in memory_bound.text and "cost about 20% of the padded step's time, not 44%" in memory_bound.text
    assert "16 rows took 1.7x one row (5.00 / 3.00 ms)" in memory_bound.text
    _every_ratio_is_its_numbers(memory_bound.text)
    no_cost = describe_padding(_trials({"1 request": [_served(3e-3)] * 2, "9 requests": [_served(4e-3)] * 2,
                                        "16 requests": [_served(3.9e-3)] * 2}), 9, 16)
    assert not no_cost.holds and "cannot tell" in no_cost.text  # 16 requests faster than 9: nothing to conclude
    flat = describe_padding(_trials({"1 request": [_served(3e-3)] * 2, "9 requests": [_served(4e-3)] * 2,
                                     "16 requests": [_served(4.01e-3)] * 2}), 9, 16)
    assert flat.holds and "cost no share these runs could see" in flat.text
    compute_bound = describe_padding(_trials({"1 request": [_served(1e-3)] * 2, "9 requests": [_served(9e-3)] * 2,
                                              "16 requests": [_served(16e-3), _served(17e-3)]}), 9, 16)
    assert not compute_bound.holds and "grew with its rows" in compute_bound.text
    assert compute_bound.warning is None  # a quiet machine, and rounds that agree: the claim simply failed here


def test_a_recorded_step_that_is_not_faster_is_said_so_and_warns_when_the_machine_was_busy():
    trials = _trials({"eager, 1": [_served(3e-3)] * 2, "compiled, 1": [_served(2e-3), _served(4e-3)]}, busy=True)
    finding = describe_recorded(trials, [1], [1, 4], "compiled")
    assert not finding.holds and "not faster in every round" in finding.text
    assert "other programs kept 2.0 of this machine's 2 cores busy" in finding.warning


def _every_ratio_is_its_numbers(text: str) -> None:
    """Each "a / b ms" pair printed is followed by its own ratio ("1.25x the time of 9 (5.00 / 4.00 ms")."""
    for ratio, a, b in re.findall(r"(\d+\.\d+)x (?:the time of \d+|one row) \((\d+\.\d+) / (\d+\.\d+) ms", text):
        places = len(ratio.split(".")[1])  # as rounded where it was printed (and the times too)
        assert float(ratio) == pytest.approx(float(a) / float(b), abs=0.6 * 10**-places + 0.01), (ratio, a, b)


def test_padding_from_impossible_numbers_concludes_nothing():
    """The walk's busy run: 16 requests faster than 9, and a '3.6x' beside times whose ratio is 2.47."""
    walk = describe_padding(_trials({"1 request": [_served(142.40e-3), _served(160e-3), _served(150e-3)],
                                     "9 requests": [_served(608.75e-3), _served(650e-3), _served(700e-3)],
                                     "16 requests": [_served(351.36e-3), _served(720e-3), _served(900e-3)]},
                                    busy=True), 9, 16)
    assert not walk.holds and "cannot tell what the padding costs: rerun this cell" in walk.text
    assert "came out faster" in walk.text and "cost" not in walk.text.split("cannot tell")[0].split("rows the step")[1]
    quiet_but_faster = describe_padding(_trials({"1 request": [_served(3e-3)] * 2, "9 requests": [_served(4e-3)] * 2,
                                                 "16 requests": [_served(3.5e-3), _served(4.5e-3)]}), 9, 16)
    assert not quiet_but_faster.holds and "cannot tell" in quiet_but_faster.text
    assert not re.search(r"\d\.\d+x (the time of|one row) \(", walk.text + quiet_but_faster.text)  # no ratio quoted


def test_a_recorded_row_quotes_one_round_whose_times_give_its_ratio():
    """The walk's table: 180.53 ms against 153.52 ms beside 0.73x (least disturbed times beside a median ratio)."""
    trials = _trials({"eager, 1": [_served(0.40), _served(0.18053), _served(0.30)],
                      "compiled, 1": [_served(0.15352), _served(0.25), _served(0.41)],
                      "eager, 3": [_served(0.42638), _served(0.60), _served(0.50)],
                      "compiled, 3": [_served(0.26928), _served(0.45), _served(0.31)]}, busy=True)
    versus = describe_recorded(trials, [1, 3], [1, 4], "compiled")
    for row in versus.numbers["rows"]:
        i = row["round"] - 1
        assert row["rounds"].per_round[i] == pytest.approx(row["speedup"]) == row["rounds"].value  # 3 rounds
        assert f"{row['eager_s'] * 1e3:.2f} ms eager, {row['recorded_s'] * 1e3:.2f} ms compiled, " \
               f"{row['speedup']:.2f}x in round {row['round']}" in versus.text
    assert not versus.holds and "the warning above" in versus.text and "if a warning follows" not in versus.text
    anatomy = Finding("", True, {"step_s": 0.2, "matmul_s": 0.005})
    words = what_recording_removed(anatomy, versus)
    assert "the rounds disagree" in words and "saved" not in words.replace("what compiling saved", "")


def test_what_recording_removed_is_worded_for_each_outcome():
    anatomy = Finding("", True, {"step_s": 3e-3, "matmul_s": 2e-3})
    saved = lambda s: Finding("", True, {"saving_s": s})  # noqa: E731
    assert "50% of the 1.00 ms" in what_recording_removed(anatomy, saved(0.5e-3))
    assert "more than the 1.00 ms" in what_recording_removed(anatomy, saved(1.5e-3))
    assert "saved nothing measurable here (-0.10 ms" in what_recording_removed(anatomy, saved(-0.1e-3))
    assert "under 1% of the 1.00 ms" in what_recording_removed(anatomy, saved(0.001e-3))
    busy_anatomy = Finding("", True, {"step_s": 3e-3, "matmul_s": 2e-3},
                           _trials({"the step": [1.0]}, busy=True))
    busy = what_recording_removed(busy_anatomy, saved(1.5e-3))
    assert "Provisional: the first measurement came with a busy-machine warning" in busy
    assert "more than the 1.00 ms" in busy and "pre-packed" not in busy  # no reason read into disturbed numbers


def _profile(label: str, ops: int, wall_us: float) -> StepProfile:
    return StepProfile(label, wall_us, [Span("aten::linear" if i % 3 else "aten::view", i, 1.0) for i in range(ops)])


def test_a_busy_anatomy_calls_its_per_operator_figure_inflated():
    results = {"the step": [_served(0.2), _served(0.21)], "its matrix multiplies": [0.005, 0.006]}
    busy = describe_anatomy(_trials(results, busy=True), _profile("eager, batch 1", 553, 2e5))
    assert busy.numbers["disturbed"] and "per-operator figure is inflated" in busy.text
    quiet = describe_anatomy(_trials(results), _profile("eager, batch 1", 553, 2e5))
    assert not quiet.numbers["disturbed"] and "inflated" not in quiet.text


def test_the_anatomy_quotes_one_round_whose_times_give_its_share():
    """A busy run: the least disturbed step (8.70 ms) and matrix multiplies (4.60 ms) came from different rounds,
    and '91% of it is something else' stood beside them; now one round's two times and its own share."""
    n = describe_anatomy(_trials({"the step": [_served(0.06), _served(0.0087), _served(0.01)],
                                  "its matrix multiplies": [0.005, 0.0046, 0.0055]}, busy=True),
                         _profile("eager, batch 1", 553, 2e5))
    assert n.numbers["other_share"] == pytest.approx(1 - n.numbers["matmul_s"] / n.numbers["step_s"])
    assert "8.70 ms" in n.text and "4.60 ms" in n.text and "in round 2, 47% of it is something else" in n.text


def test_the_profiles_ratio_is_the_one_of_the_profiles_drawn():
    trials = _trials({"eager": [_profile("eager", 553, 85e3), _profile("eager", 553, 90e3)],
                      "compiled": [_profile("compiled", 80, 39e3), _profile("compiled", 80, 120e3)]}, busy=True)
    finding = describe_profiles(trials)
    assert "eager's profile 2.2x as long as compiled's" in finding.text  # 85 / 39, the two drawn
    assert "the warning above" in finding.text and "follows" not in finding.text
    slower = describe_profiles(_trials({"eager": [_profile("eager", 553, 30e3)],
                                        "compiled": [_profile("compiled", 80, 45e3)]}))
    assert "compiled's profile 1.5x as long as eager's" in slower.text and not slower.holds


def test_the_profilers_stretch_is_computed_and_its_order_compared():
    saved = {"eager": (5.12e-3, 3.18e-3), "compiled": (2.52e-3, 2.42e-3)}
    same = profiler_stretch({"eager": (4e-3, 3e-3), "compiled": (2.1e-3, 2e-3)}, saved)
    assert "eager 5.12 ms profiled / 3.18 ms measured (1.61x)" in same and same.endswith("the same order.")
    other = profiler_stretch({"eager": (4e-3, 3.9e-3), "compiled": (2.4e-3, 2e-3)}, saved)
    assert "eager 4.00 ms profiled / 3.90 ms measured (1.03x)" in other and "another order" in other
    shorter = profiler_stretch({"eager": (48.58e-3, 63.72e-3), "compiled": (35.22e-3, 150.40e-3)}, saved)
    assert "here eager and compiled profiled shorter than measured" in shorter and "same order" not in shorter
