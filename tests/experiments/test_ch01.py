"""Chapter 1's live experiments hold or warn under load, and their words follow their numbers
(checked both ways on made-up rounds, where the outcome is known)."""

from __future__ import annotations

import pytest

import minillm
from experiments.ch01 import (
    LatencyFit,
    Timed,
    cache_vs_no_cache,
    check_latency_model,
    describe_cache,
    describe_naive_step,
    fit_latency_model,
    greedy,
    naive_step_growth,
    quadratic_text,
    queue_ttft,
    times,
    ttft_breakdown,
)
from minillm.timing import CpuUse, Trials
from tests.cpu_hog import cpu_hog

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/experiments/conftest.py


QUIET = CpuUse(wall_s=1.0, ours_s=1.0, others_s=0.0, cores=2, threads=2)  # a quiet second of two threads


@pytest.fixture(scope="module")
def shipped():
    return minillm.load()


def test_naive_step_under_a_cpu_hog_holds_or_warns(shipped):
    with cpu_hog():
        finding = naive_step_growth(*shipped, short=5, long=200, rounds=2)
    assert finding.warning or finding.holds, finding.text
    assert f"{finding.numbers['long_ms']:.1f} ms" in finding.text


def test_naive_step_words_both_ways():
    grew = describe_naive_step(Trials({"5 tokens": [0.010, 0.011], "500 tokens": [0.130, 0.150]}, QUIET), 5, 500)
    assert grew.holds and "13x the time" in grew.text and "The work grew 100x, the time less" in grew.text
    assert grew.warning is None
    noisy = describe_naive_step(Trials({"5 tokens": [0.010, 0.200], "500 tokens": [0.130, 0.150]}, QUIET), 5, 500)
    assert not noisy.holds and "not slower" in noisy.text and "went both ways" in noisy.warning


def test_cache_under_a_cpu_hog_holds_or_warns(shipped):
    # a long prompt, so that even short answers show the naive loop's recomputation
    with cpu_hog():
        finding = cache_vs_no_cache(*shipped, prompt="ROMEO:\n" * 60, lengths=(2, 8), rounds=2)
    assert finding.warning or finding.holds, finding.text


def _loops(no_cache, cached):
    runs = {f"no cache, {m}": [Timed(t, ()) for t in ts] for m, ts in zip((16, 128), no_cache)}
    runs.update({f"KV cache, {m}": [Timed(t, ()) for t in ts] for m, ts in zip((16, 128), cached)})
    return Trials(runs, QUIET)


def test_cache_words_both_ways():
    held = describe_cache(_loops([[0.3, 0.32], [3.6, 4.0]], [[0.2, 0.21], [1.5, 1.6]]), (16, 128))
    n = held.numbers
    assert held.holds and held.warning is None
    assert f"the no-cache time grew {times(n['growth_no_cache'])}" in held.text
    assert "8x the tokens (16 → 128)" in held.text
    assert "the more the cache saves" in held.text
    # a round where the cached loop grew faster than the naive one: the words and the guard say so
    noisy = describe_cache(_loops([[0.3, 0.32], [3.6, 1.0]], [[0.2, 0.21], [1.5, 1.6]]), (16, 128))
    assert not noisy.holds and "do not agree" in noisy.text and "went both ways" in noisy.warning


def _prompts(count: int) -> list[str]:
    verse = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    return [(verse * 4)[: 20 + 30 * i] for i in range(count)]


def test_queue_under_a_cpu_hog_holds_or_warns(shipped):
    with cpu_hog():
        finding = queue_ttft(*shipped, _prompts(3), greedy(3), rounds=2)
    assert finding.warning or finding.holds, finding.text
    assert f"median TTFT by {times(finding.numbers['p50'])}" in finding.text
    run = finding.numbers["run"]
    assert all(a.ttft <= b.ttft for a, b in zip(run.alone, run.as_seen))


def test_ttft_breakdown_under_a_cpu_hog_holds_or_warns():
    replay = lambda: (92, 7, {"tokenize": 0.0005, "admit": 0.0004, "prefill + sample": 0.030})  # noqa: E731
    with cpu_hog():
        finding = ttft_breakdown(replay, rounds=3)
    assert finding.warning or finding.holds, finding.text
    assert "33x the 0.90 ms of tokenize and admit" in finding.text
    close = ttft_breakdown(lambda: (92, 7, {"tokenize": 0.004, "admit": 0.004, "prefill + sample": 0.010}), rounds=2)
    assert not close.holds and "8.00 ms against the prefill's 10.0 ms" in close.text


def test_fit_and_its_check_under_a_cpu_hog_hold_or_warn(shipped):
    with cpu_hog():
        fitted = fit_latency_model(*shipped, lengths=(16, 64, 128, 256), new_tokens=8, rounds=2)
        fit = fitted.numbers["fit"]
        predict = lambda L, M: (fit.prefill(L), fit.prefill(L) + (M - 1) * fit.decode(L + M / 2))  # noqa: E731
        checked = check_latency_model(*shipped, predict, cases=((32, 8), (192, 8)), rounds=2)
    assert fitted.warning or fitted.holds, fitted.text
    assert f"{fit.p0:.2f} ms + {fit.p1 * 1e3:.1f} µs × L + {fit.p2 * 1e6:.1f} ns × L²" in fitted.text
    assert min(fit.p0, fit.p1, fit.p2, fit.d0, fit.d1) >= 0  # no cost below zero
    assert len(fitted.numbers["sweep_fits"]) == 2
    # The check compares against the fit: a fit disturbed by the hog (its own cell warned) predicts
    # a quiet run badly, and the check's words name that cause.
    assert checked.warning or checked.holds or (fitted.warning and "rerun the fit's cell" in checked.text), checked.text
    assert f"{checked.numbers['worst']:.0%}" in checked.text


def _fit(p0, p1, p2, lengths=(16, 512, 1024)) -> LatencyFit:
    prefill = [p0 + p1 * L + p2 * L * L for L in lengths]
    return LatencyFit.fit(lengths, prefill, [L + 4 for L in lengths], [10.0 + 0.001 * L for L in lengths])


def test_the_fit_recovers_its_coefficients_and_the_words_follow_them():
    fit = _fit(10.0, 0.05, 2e-5)
    assert (round(fit.p0, 6), round(fit.p1, 6), round(fit.p2, 9)) == (10.0, 0.05, 2e-5)
    share = fit.quadratic_share(1024)  # 2e-5·1024² / (0.05·1024 + 2e-5·1024²) = 0.29
    assert f"{share:.0%}" in quadratic_text(fit, [fit, fit], 1024, 0.25) and "about what the FLOPs predict" in \
        quadratic_text(fit, [fit, fit], 1024, 0.25)
    assert "more per FLOP" in quadratic_text(fit, [fit], 1024, 0.1)
    assert "only" in quadratic_text(fit, [fit], 1024, 0.6)
    flat = _fit(10.0, 0.05, 0.0)
    assert flat.p2 == 0 and "no L² term at all" in quadratic_text(flat, [flat], 1024, 0.25)
    spread = quadratic_text(fit, [_fit(10.0, 0.05, 1e-6), _fit(10.0, 0.01, 5e-5)], 1024, 0.25)
    assert "too wide a spread" in spread
