"""Chapter 7's live experiments hold or warn under load, and their words follow their numbers."""

from __future__ import annotations

import pytest

import minillm
from experiments.ch07 import pass_costs, predicted_speedup, speculation_speedup
from tests.cpu_hog import cpu_hog


@pytest.fixture(scope="module")
def models():
    return minillm.load_model(), minillm.load_model("draft"), minillm.load_tokenizer()


def _passages(tokenizer) -> list[list[int]]:
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    return [text[100:132]]


def _small_costs(target, draft):
    return pass_costs(target, draft, context=64, sizes=(1, 5), rounds=2, repeats=3)


def test_under_a_cpu_hog_the_findings_hold_or_the_guard_fires(models):
    target, draft, tokenizer = models
    with cpu_hog():
        costs = _small_costs(target, draft)
        run = speculation_speedup(target, tokenizer, _passages(tokenizer), k=2, new_tokens=8, rounds=2,
                                  costs=costs.numbers)
    assert costs.warning or costs.holds, costs.text
    assert run.warning or run.holds, run.text


def test_the_words_are_the_numbers(models):
    target, draft, tokenizer = models
    costs = _small_costs(target, draft)
    n = costs.numbers
    assert f"{n['verify_cost'][5]:.2f}x a one-token pass" in costs.text and f"c = {n['draft_cost']:.2f}" in costs.text
    assert ("not 5x" in costs.text) == costs.holds
    run = speculation_speedup(target, tokenizer, _passages(tokenizer), k=4, new_tokens=16, rounds=2, costs=n)
    r = run.numbers
    assert f"{r['plain_tok_s']:.0f} -> {r['spec_tok_s']:.0f} tokens/s" in run.text
    assert f"{r['tokens_per_pass']:.2f} per target pass" in run.text and f"alpha = {r['alpha']:.0%}" in run.text
    assert r["predicted"] == pytest.approx(predicted_speedup(r["tokens_per_pass"], 4, n))
    assert f"{r['predicted']:.2f}x" in run.text
    assert (f"speculation was {r['speedup']:.2f}x faster" in run.text) == run.holds
    # the speculation counts are this run's requests alone: one passage of 16 tokens, the warm-up left out
    assert run.numbers["speculative"].counts["emitted"] <= 16


def test_the_words_say_why_when_speculation_did_not_pay():
    from experiments.ch07 import predicted_speedup as predict

    costs = {"verify_cost": {5: 2.0}, "draft_cost": 0.5}  # a round of 4 steps for at most 5 tokens
    assert predict(2.0, 4, costs) == pytest.approx(0.5)
    assert predict(2.0, 3, costs) is None  # no pass over 4 tokens was measured
