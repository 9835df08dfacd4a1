"""Chapter 2's live experiments hold or warn under load, and their words follow their numbers
(checked both ways on made-up rounds, where the outcome is known)."""

from __future__ import annotations

import pytest

import minillm
from experiments.ch02 import (
    DecodeSteps,
    Served,
    decode_step_by_batch,
    describe_batches,
    describe_serial_vs_static,
    serial_vs_static,
)
from minillm import LLM, EngineConfig
from minillm.timing import CpuUse, Trials
from tests.cpu_hog import cpu_hog

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/experiments/conftest.py


QUIET = CpuUse(wall_s=1.0, ours_s=1.0, others_s=0.0, cores=2, threads=2)  # a quiet second of two threads


def test_decode_steps_under_a_cpu_hog_hold_or_warn():
    llm = LLM(config=EngineConfig(batching="static", max_num_seqs=8, max_model_len=64))
    with cpu_hog():
        finding = decode_step_by_batch(llm, (1, 8), new_tokens=5, rounds=2)
    assert finding.warning or finding.holds, finding.text
    assert f"{finding.numbers['step_s'][8] * 1e3:.1f} ms" in finding.text or not finding.holds


def test_decode_step_words_both_ways():
    steps = lambda b, times: [DecodeSteps(b, t) for t in times]  # noqa: E731
    held = describe_batches(Trials({"batch 1": steps(1, [0.009, 0.010]), "batch 32": steps(32, [0.022, 0.024])},
                                   QUIET), (1, 32))
    assert held.holds and held.warning is None
    assert "a decode step became 2.4x slower (9.0 → 22.0 ms" in held.text and "throughput went up 13x" in held.text
    noisy = describe_batches(Trials({"batch 1": steps(1, [0.009, 0.010]), "batch 32": steps(32, [0.022, 0.400])},
                                    QUIET), (1, 32))
    assert not noisy.holds and "not give more tokens per second" in noisy.text
    assert "went both ways" in noisy.warning


def test_serial_vs_static_under_a_cpu_hog_holds_or_warns():
    model, tokenizer = minillm.load()
    work = [("ROMEO:", 4), ("What is 1+1? Answer:", 8), ("KING:", 6)]
    with cpu_hog():
        finding = serial_vs_static(model, tokenizer, work, slots=3, rounds=2)
    assert finding.warning or finding.holds, finding.text
    assert finding.numbers["utilisation"] == 18 / 24  # (4 + 8 + 6) busy slot-steps of 3 slots x 8 steps


def test_serial_vs_static_words_both_ways():
    def trials(serial, static):
        return Trials({"one at a time": [Served(t, ()) for t in serial],
                       "static, B=8": [Served(t, (), 0.67) for t in static]}, QUIET)

    held = describe_serial_vs_static(trials([11.0, 12.0, 11.5], [3.5, 3.6, 3.4]), 800, 8)
    assert held.holds and "3.3x as fast" in held.text and "below 8" in held.text and "33% of the batch's" in held.text
    noisy = describe_serial_vs_static(trials([11.0, 3.0, 11.5], [3.5, 3.6, 3.4]), 800, 8)
    assert not noisy.holds and "not faster" in noisy.text  # one round disagreed: no claim, and the guard says why
    assert "one at a time / static, B=8 went both ways" in noisy.warning
    lost = describe_serial_vs_static(trials([3.0, 3.0], [3.5, 3.6]), 800, 8)
    assert not lost.holds and "not faster" in lost.text
