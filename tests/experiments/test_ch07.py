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
    rate = lambda g: g.tok_per_s  # noqa: E731
    for plain, fast, ratio in zip(run.trials.values("plain", rate), run.trials.values("speculative", rate),
                                  r["per_round"]):  # each round's two rates and their ratio, whose median is quoted
        assert f"{plain:.0f} -> {fast:.0f} tokens/s ({ratio:.2f}x)" in run.text
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


# ------------------------------------------------------------------ the words, on rounds made up for them


def _trials(results: dict, busy: bool):
    from minillm.timing import CpuUse, Trials

    return Trials(results, CpuUse(10.0, 10.0, 15.0 if busy else 0.0, 2, 2), rerun="this cell")


def _fake_interleaved(monkeypatch, results: dict, busy: bool = False) -> None:
    import experiments.ch07 as ch07

    monkeypatch.setattr(ch07, "interleaved", lambda runs, rounds, **kw: _trials(results, busy))


def _pass_rounds(ms: dict[int, list[float]], draft: list[float]) -> dict:
    return {**{f"target {n}": [t / 1e3 for t in times] for n, times in ms.items()}, "draft 1": [t / 1e3 for t in draft]}


def test_a_pass_dearer_than_its_tokens_is_not_read_as_a_saving(models, monkeypatch, capsys):
    """A learner walk saw "checking 5 tokens costs 1.91x, not 5x" beside a table where 4 tokens cost 5.03x."""
    target, draft, _ = models
    _fake_interleaved(monkeypatch, _pass_rounds({1: [10, 10, 10], 4: [50, 52, 48], 5: [19, 20, 18]}, [2, 2, 2]),
                      busy=True)
    costs = pass_costs(target, draft, context=16, sizes=(1, 4, 5))
    assert not costs.holds and "not 5x" not in costs.text
    assert "a pass over 4 tokens cost 5.00x a one-token pass, more than 4 separate passes" in costs.text
    costs.show()
    out = capsys.readouterr().out
    assert out.index("⚠") < out.index("least disturbed round") < out.index("contradict themselves")


def test_the_words_quote_the_tables_statistic_and_read_as_provisional_when_disturbed(models, monkeypatch, capsys):
    """The draft's c is its row's median, never a least-disturbed time set beside a median ratio."""
    target, draft, _ = models
    rounds = _pass_rounds({1: [120, 10, 10], 5: [150, 17, 16]}, [1.5, 2.0, 2.5])  # one round spoiled
    _fake_interleaved(monkeypatch, rounds)
    quiet = pass_costs(target, draft, context=16, sizes=(1, 5))
    assert quiet.warning is None and quiet.holds
    assert quiet.text.startswith("Checking 5 tokens costs 1.60x a one-token pass, not 5x")
    assert "c = 0.20 of a one-token target pass (its row's median)" in quiet.text and " ms" not in quiet.text
    quiet.show()
    table = capsys.readouterr().out
    assert "0.01  0.20  0.25" in table and table.rstrip().count("0.20") >= 2  # the rounds, then their median
    _fake_interleaved(monkeypatch, rounds, busy=True)
    busy = pass_costs(target, draft, context=16, sizes=(1, 5))
    assert busy.warning and busy.text.startswith("In these disturbed rounds, checking 5 tokens cost 1.60x")
    assert "c = 0.20" in busy.text and "cost, in these rounds," in busy.text


def _generated(seconds: float, spec: bool):
    from types import SimpleNamespace

    from experiments.ch07 import Generated

    counts = {"drafted": 40, "accepted": 20, "examined": 30, "emitted": 60, "passes": 30} if spec else None
    return Generated(None, [SimpleNamespace(token_ids=list(range(64)))], seconds, counts)


def _speedup_with(monkeypatch, models, plain_s: list[float], spec_s: list[float], costs: dict, busy: bool = False):
    target, _, tokenizer = models
    _fake_interleaved(monkeypatch, {"plain": [_generated(t, False) for t in plain_s],
                                    "speculative": [_generated(t, True) for t in spec_s]}, busy)
    return speculation_speedup(target, tokenizer, [[1, 2, 3]], k=4, costs=costs)


def test_a_predicted_loss_unlike_the_measured_one_is_not_called_as_much(models, monkeypatch):
    """A learner walk read "the pass costs predict as much (0.69x)" beside a measured 0.42x."""
    costs = {"verify_cost": {5: 2.0}, "draft_cost": 0.4}  # 2 tokens a round for 3.6 steps: 0.56x
    run = _speedup_with(monkeypatch, models, [1.0, 1.0, 1.0], [2.5, 2.4, 2.6], costs)  # 0.40x measured
    assert not run.holds and "as much" not in run.text
    assert "predict a loss too, though a smaller one: 0.56x, against the 0.40x measured" in run.text
    assert "On this machine, now, k = 4 does not pay." in run.text
    close = _speedup_with(monkeypatch, models, [1.0, 1.0, 1.0], [1.8, 1.75, 1.85], costs)  # 0.56x measured
    assert "predict about that, 0.56x" in close.text


def test_the_speedup_words_show_each_rounds_ratio_and_hedge_when_disturbed(models, monkeypatch):
    costs = {"verify_cost": {5: 1.5}, "draft_cost": 0.1}
    run = _speedup_with(monkeypatch, models, [1.0, 2.0, 1.0], [0.5, 1.0, 0.8], costs)
    assert run.holds and "64 -> 128 tokens/s (2.00x); 32 -> 64 tokens/s (2.00x); 64 -> 80 tokens/s (1.25x)" in run.text
    assert "So speculation was 2.00x faster (the median of the rounds' ratios)" in run.text
    busy = _speedup_with(monkeypatch, models, [1.0, 2.0, 1.0], [0.5, 1.0, 0.8], costs, busy=True)
    assert "In these disturbed rounds speculation was 2.00x faster" in busy.text
    lost = _speedup_with(monkeypatch, models, [1.0, 1.0, 1.0], [2.5, 2.4, 2.6], {"verify_cost": {5: 2.0},
                                                                              "draft_cost": 0.4}, busy=True)
    assert "If the disturbed rounds are right, k = 4 does not pay here" in lost.text
    assert "On this machine, now" not in lost.text
