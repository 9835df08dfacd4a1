"""minillm/timing.py: rounds interleave and rotate, ratios pair within a round, and the guard fires
when other processes take the CPU or the rounds disagree."""

from __future__ import annotations

import itertools
import math
import time

import psutil
import pytest
import torch

from minillm.timing import CpuUse, CpuWatch, PairedRatio, Trials, interleaved
from tests.cpu_hog import cpu_hog


def test_rounds_rotate_the_order():
    order = []
    interleaved({name: (lambda n=name: order.append(n) or 1.0) for name in "ABC"}, rounds=3)
    assert order == list("ABCBCACAB")


def test_warmup_runs_each_once_unrecorded():
    calls = itertools.count()
    trials = interleaved({"A": lambda: float(next(calls))}, rounds=2, warmup=True)
    assert trials.values("A") == [1.0, 2.0]


def test_ratios_pair_within_a_round_and_quote_the_median():
    trials = Trials({"A": [2.0, 4.0, 30.0], "B": [1.0, 2.0, 10.0]}, CpuUse(1, 1, 0, 2, 2))
    ratio = trials.ratio("A", "B")
    assert ratio.per_round == (2.0, 2.0, 3.0) and ratio.value == 2.0 and f"{ratio:.1f}" == "2.0"
    assert trials.best("A") == 2.0 and trials.spread("B") == 10.0
    assert trials.trustworthy and trials.warning() is None
    assert "varied 10.0x" in trials.warning(metric=float)


def test_a_comparison_that_goes_both_ways_is_flagged():
    trials = Trials({"A": [1.0, 1.0, 1.0], "B": [0.8, 1.3, 0.9]}, CpuUse(1, 1, 0, 2, 2))
    assert not trials.ratio("A", "B").agrees
    warning = trials.warning()
    assert "A / B went both ways over the rounds (1.25, 0.77, 1.11)" in warning and "rerun this cell" in warning


def test_a_machine_busy_before_the_rounds_keeps_the_warning_when_fewer_threads_hide_it_from_them():
    """Seen in CI: the glance found 1.9 of 2 cores busy, the rounds ran on 1 thread, and in their 0.2 s
    the others' share fell under the threshold for one thread — the printed "will be disturbed" must stand."""
    before = CpuUse(wall_s=0.25, ours_s=0.0, others_s=0.475, cores=2, threads=2)
    rounds = CpuUse(wall_s=0.2, ours_s=0.2, others_s=0.22, cores=2, threads=1)
    assert before.busy and not rounds.busy
    assert Trials({"a": [1.0]}, rounds).warning() is None
    warning = Trials({"a": [1.0]}, rounds, before=before).warning()
    assert warning is not None and "before the rounds, other programs kept 1.9 of this machine's 2 cores" in warning
    assert Trials({"a": [1.0]}, rounds, before=CpuUse(0.25, 0.0, 0.0, 2, 2)).warning() is None


@pytest.mark.parametrize(("others_s", "cores", "threads", "busy"),
                         [(0.35, 2, 2, False), (0.5, 2, 2, True), (1.15, 2, 1, False), (1.3, 2, 1, True),
                          (2.3, 4, 2, False), (2.5, 4, 2, True)])
def test_busy_means_others_took_cores_our_threads_needed(others_s, cores, threads, busy):
    assert CpuUse(wall_s=1.0, ours_s=1.0, others_s=others_s, cores=cores, threads=threads).busy is busy


def test_paired_ratio_ties_agree_with_either_side():
    assert PairedRatio("a", "b", (1.0, 1.2, 1.1)).agrees
    assert not PairedRatio("a", "b", (0.9, 1.2)).agrees


def test_a_ratio_is_judged_on_the_side_of_what_its_claim_turns_on():
    # chapter 7: a pass over 5 tokens costs about one pass (rounds 0.98, 1.05): "under 2.5" holds every round
    assert PairedRatio("5", "1", (0.98, 1.05), around=2.5).agrees and not PairedRatio("5", "1", (0.98, 1.05)).agrees
    assert not PairedRatio("5", "1", (2.4, 2.6), around=2.5).agrees
    trials = Trials({"A": [1.0, 2.6], "B": [1.0, 1.0]}, CpuUse(1.0, 1.0, 0.0, 2, 2))
    trials.ratio("A", "B", what="a pass", around=2.5)
    assert trials.problems() == ["a pass, A / B, went both ways of 2.5 over the rounds (1.00, 2.60)"]


def _matmuls() -> float:
    x = torch.randn(256, 256)
    for _ in range(300):
        x = (x @ x).tanh()
    return 1.0


def test_the_watch_counts_our_own_threads_as_ours():
    with CpuWatch() as watch:
        _matmuls()
    use = watch.use
    assert use.ours_s > 0 and use.wall_s > 0 and use.cores >= 1 and use.threads == torch.get_num_threads()


def test_under_a_cpu_hog_the_guard_fires():
    with cpu_hog():
        trials = interleaved({"A": _matmuls, "B": _matmuls}, rounds=3)
    assert trials.cpu.busy, trials.cpu
    assert trials.warning().startswith("⚠ Other work was running while this measured")
    assert "other programs kept" in trials.warning()


def test_the_hog_is_not_counted_as_ours():
    """Found in review: the hog's loops were children of the test process, and CpuWatch counts children as
    its own work, so on a quiet machine the guard never saw them."""
    import psutil

    with cpu_hog() as pids:
        mine = {p.pid for p in psutil.Process().children(recursive=True)}
        assert pids and not set(pids) & mine
        assert all(psutil.Process(pid).is_running() for pid in pids)
    time.sleep(0.2)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_a_zero_denominator_gives_a_ratio_that_agrees_with_nothing():
    """Found by a learner walk: a load run against a stopped server divided by zero."""
    trials = Trials({"heavy": [0.0, 5.0], "light": [0.0, 0.0]}, CpuUse(1, 1, 0, 2, 2))
    ratio = trials.ratio("heavy", "light", what="output throughput")
    assert math.isnan(ratio.per_round[0]) and ratio.per_round[1] == math.inf and not ratio.agrees
    assert "output throughput, heavy / light, went both ways" in trials.warning()


def test_progress_says_what_runs_and_warns_before_measuring_on_a_busy_machine(capsys):
    interleaved({"A": lambda: 1.0, "B": lambda: 1.0}, rounds=2)
    out = capsys.readouterr().out
    assert "measuring: round 2 of 2, A" in out and "measured 2 configurations x 2 rounds in" in out
    with cpu_hog():
        interleaved({"A": _matmuls}, rounds=1)
    warned = capsys.readouterr().out
    assert "⚠ Before measuring: other programs kept" in warned
    assert max(len(line) for line in warned.split("\n") if "\r" not in line) <= 100  # wrapped, as the words are
    interleaved({"A": lambda: 1.0}, rounds=1, progress=False)
    assert capsys.readouterr().out == ""


def test_per_round_ratios_read_as_a_list_and_every_run_is_reachable():
    ratio = PairedRatio("a", "b", (1.314, 0.9))
    assert ratio.rounds() == "1.31x, 0.90x"
    assert ratio.rounds("{:.1f}") == "1.3, 0.9"
    assert ratio.rounds(lambda r: f"{r:.0%}") == "131%, 90%"
    trials = Trials({"a": [1, 2], "b": [3, 4]}, CpuUse(1.0, 1.0, 0.0, 2, 2))
    assert trials.all_runs() == [1, 2, 3, 4]


def test_same_tokens_returns_them_and_names_the_change_that_broke_them():
    from types import SimpleNamespace

    from experiments import same_tokens

    run = lambda *tokens: SimpleNamespace(outputs=[SimpleNamespace(token_ids=t) for t in tokens])  # noqa: E731
    quiet = CpuUse(1.0, 1.0, 0.0, 2, 2)
    assert same_tokens(Trials({"a": [run([1, 2])], "b": [run([1, 2])]}, quiet), "x") == [[1, 2]]
    with pytest.raises(AssertionError, match="the prefix cache changed a token"):
        same_tokens(Trials({"a": [run([1, 2])], "b": [run([1, 3])]}, quiet), "the prefix cache")


def test_on_a_busy_machine_the_rounds_run_with_the_threads_that_fit_beside_the_other_work(capsys):
    """One busy program beside torch's threads on every core: a thread sharing a core with it stalls
    every operation (a chapter's cell took 88 s instead of 4). The rounds then run with one thread
    fewer, say so, and the threads are as they were afterwards."""
    cores = psutil.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: no thread to spare")
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        with cpu_hog(1):
            trials = interleaved({"a": torch.get_num_threads, "b": torch.get_num_threads}, rounds=2)
        assert torch.get_num_threads() == cores
    finally:
        torch.set_num_threads(before)
    printed = " ".join(capsys.readouterr().out.split())  # the words, unwrapped
    assert trials.values("a") == trials.values("b") == [cores - 1] * 2, printed
    assert f"torch computes with {cores - 1} thread" in printed and f"instead of {cores}" in printed
    assert trials.cpu.threads == cores - 1


def test_free_cores_round_what_others_leave():
    use = lambda others: CpuUse(wall_s=1.0, ours_s=0.0, others_s=others, cores=2, threads=2)  # noqa: E731
    assert [use(o).free_cores for o in (0.0, 0.3, 1.0, 1.4, 2.0)] == [2, 2, 1, 1, 1]


def test_fit_threads_cuts_torch_threads_on_a_busy_machine_and_leaves_a_quiet_one():
    import torch

    from minillm.timing import fit_threads
    from tests.cpu_hog import cpu_hog

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with cpu_hog():
            said = fit_threads()
        # a loop on every core: at most one core counts as free, so one thread is what fits
        assert said is not None and torch.get_num_threads() == 1, said
        assert "torch computes with 1 thread instead of 2" in said
        torch.set_num_threads(1)
        assert fit_threads() is None and torch.get_num_threads() == 1  # already fits: nothing to do
    finally:
        torch.set_num_threads(before)
