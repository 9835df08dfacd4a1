"""The graders are proven both ways: every case passes on `solutions/`, the untouched `exercises/`
stubs are "not started", and every plausible wrong answer (wrong_answers.py) fails naming its rule."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from exercises.grading import EXERCISES, check, core, load, run
from exercises.grading.ch01 import _cached_tiny_model
from exercises.grading.core import Exercise, call, expect
from tests.exercises.wrong_answers import WRONG

NAMES = sorted(EXERCISES)


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_passes_every_case(name):
    failures = [r.line() for r in run(name, load(name, "solutions")) if not r.passed]
    assert not failures


@pytest.mark.parametrize("name", NAMES)
def test_the_untouched_stub_is_not_started(name, capsys):
    results = run(name, load(name, "exercises"))
    assert results and all(r.status == "not started" for r in results)
    check(name)
    assert capsys.readouterr().out == f"{name}: not started (the code still raises NotImplementedError)\n"


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_has_at_least_two_wrong_answers(name):
    assert sum(exercise == name for exercise, _, _ in WRONG) >= 2


@pytest.mark.parametrize(("name", "impl", "rule"), WRONG, ids=[f"{n}-{i.__name__}" for n, i, _ in WRONG])
def test_a_wrong_answer_fails_naming_the_broken_rule(name, impl, rule):
    failures = [r.line() for r in run(name, impl) if not r.passed]
    assert failures, f"{impl.__name__} passes every case of {name}"
    assert any(rule in line for line in failures), "\n".join(failures)
    assert all(" expected " in line and ", got " in line for line in failures), "\n".join(failures)


def test_check_prints_each_case_and_the_score(capsys):
    def keep_everything(logits, top_p):
        return logits

    check("ch01.top_p", keep_everything)
    out = capsys.readouterr().out
    assert "PASS  top p one keeps everything" in out
    assert "FAIL  keeps the token that crosses the boundary: probabilities [0.05, 0.5, 0.15, 0.3]" in out
    assert out.rstrip().endswith(f"ch01.top_p: 3/{len(EXERCISES['ch01.top_p'].cases)} passed")


def test_a_crash_is_reported_with_the_input_the_expected_and_the_line(capsys):
    def crashes(steps, num_slots):
        return steps[0][0] / 0

    check("ch02.slot_utilisation", crashes)
    out = capsys.readouterr().out
    assert ("FAIL  no steps is zero: slot_utilisation([], num_slots=4): expected 0.0000 (no steps at all), "
            "got IndexError") in out
    assert f"of {__file__})" in out


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="ch01.top_p"):
        run("ch99.nothing", print)


def test_each_case_gets_its_own_model():
    """A learner's code that spoils the model it is given cannot spoil the next case."""

    def spoil_the_model(model, prompt_ids, max_new_tokens):
        for p in model.parameters():
            p.data.zero_()
        return [0] * max_new_tokens

    run("ch01.kv_decode", spoil_the_model)
    assert all(p.abs().sum() > 0 for p in _cached_tiny_model().parameters())
    assert not [r.line() for r in run("ch01.kv_decode", load("ch01.kv_decode", "solutions")) if not r.passed]


# ----------------------------------------------------------------------------- check() re-reads the files


@pytest.fixture
def learner_package(tmp_path, monkeypatch):
    """A package `learner_copy` (a stand-in for exercises/) and a writer for its slot_utilisation file."""
    (tmp_path / "learner_copy").mkdir()
    (tmp_path / "learner_copy" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda body: (tmp_path / "learner_copy" / "ch02_slot_utilisation.py").write_text(textwrap.dedent(body))
    for module in [m for m in sys.modules if m.startswith("learner_copy")]:
        del sys.modules[module]


WRONG_FILE = """
    def slot_utilisation(steps, num_slots):
        return 0.5
"""
RIGHT_FILE = (Path(__file__).parents[2] / "solutions" / "ch02_slot_utilisation.py").read_text()


def test_check_without_an_implementation_rereads_the_file(learner_package, capsys):
    learner_package(WRONG_FILE)
    check("ch02.slot_utilisation", package="learner_copy")
    assert "0/4 passed" in capsys.readouterr().out
    learner_package(RIGHT_FILE)  # edited within the same second: no kernel restart, no stale bytecode
    check("ch02.slot_utilisation", package="learner_copy")
    assert "4/4 passed" in capsys.readouterr().out


def test_check_rereads_a_stale_import_from_the_exercise_file(learner_package, capsys):
    learner_package(WRONG_FILE)
    from learner_copy.ch02_slot_utilisation import slot_utilisation  # imported before the fix

    learner_package(RIGHT_FILE)
    check("ch02.slot_utilisation", slot_utilisation, package="learner_copy")
    assert "4/4 passed" in capsys.readouterr().out


def test_a_function_from_the_notebook_is_graded_as_given(learner_package, capsys):
    learner_package(WRONG_FILE)

    def slot_utilisation(steps, num_slots):
        return 0.5

    slot_utilisation.__module__ = "__main__"
    check("ch02.slot_utilisation", slot_utilisation, package="learner_copy")
    assert "0/4 passed" in capsys.readouterr().out


def test_a_file_that_does_not_import_is_reported(learner_package, capsys):
    learner_package("def slot_utilisation(steps, num_slots)\n    return 0.0\n")
    check("ch02.slot_utilisation", package="learner_copy")
    out = capsys.readouterr().out
    assert "FAIL  learner_copy/ch02_slot_utilisation.py does not import: expected no error, got SyntaxError" in out
    # the learner's file and line, with the line itself; not importlib's frames (found by a learner walk)
    assert "(line 1 of " in out
    assert "learner_copy/ch02_slot_utilisation.py: 'def slot_utilisation(steps, num_slots)')" in out
    assert "importlib" not in out and "<frozen" not in out


# ----------------------------------------------------------------------------- the time limit

ENDLESS = """
    def slot_utilisation(steps, num_slots):
        total = 0
        while True:
            total += 1
"""
SWALLOWING = """
    def slot_utilisation(steps, num_slots):
        while True:
            try:
                sum(range(1000))
            except Exception:
                pass
"""


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(EXERCISES["ch02.slot_utilisation"], "time_limit_s", 0.3)


@pytest.mark.parametrize("body", [ENDLESS, SWALLOWING], ids=["endless", "catches-Exception"])
def test_an_endless_loop_fails_its_case_naming_the_line(learner_package, short_limit, capsys, body):
    """Found by a learner walk: an endless loop hung check() and make grade."""
    learner_package(body)
    started = time.perf_counter()
    check("ch02.slot_utilisation", package="learner_copy")
    out = capsys.readouterr().out
    assert time.perf_counter() - started < 5, "check() should stop after the first case's 0.3 s"
    first, *rest = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert "expected an answer, got no answer within 0.3 s, stopped at line " in first
    assert "learner_copy/ch02_slot_utilisation.py (an endless loop?)" in first
    assert rest and all("not run: an earlier case ran out of time" in line for line in rest)
    assert out.rstrip().endswith("0/4 passed")


def test_the_time_limit_holds_off_the_main_thread(learner_package, short_limit):
    learner_package(ENDLESS)
    results: list = []
    worker = threading.Thread(target=lambda: results.extend(run("ch02.slot_utilisation",
                                                                    load("ch02.slot_utilisation", "learner_copy"))))
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "run() off the main thread did not stop the endless loop"
    assert results[0].status == "timed out" and "no answer within 0.3 s" in results[0].got


def test_an_endless_loop_at_import_is_reported(learner_package, short_limit, capsys):
    learner_package("while True:\n    pass\n")
    check("ch02.slot_utilisation", package="learner_copy")
    out = capsys.readouterr().out
    assert "does not import: expected no error, got TimeoutError: importing it took more than 0.3 s" in out


def test_the_time_limit_leaves_no_timer_behind(learner_package, short_limit):
    """After a run, no alarm is pending and the SIGALRM handler is the one from before."""
    before = signal.getsignal(signal.SIGALRM)
    learner_package(RIGHT_FILE)
    assert all(r.passed for r in run("ch02.slot_utilisation", load("ch02.slot_utilisation", "learner_copy")))
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before


def test_an_unchained_block_key_fails_only_the_chaining_rules_and_names_the_first_wrong_key():
    """Found by a learner walk: the count rule failed an answer whose only mistake was the chain, and the
    FAIL line showed two lists of 19-digit integers to compare by eye."""
    from tests.exercises.wrong_answers import keys_without_the_chain

    results = run("ch05.block_keys", keys_without_the_chain)
    (count_rule,) = [r for r in results if "As many keys as full blocks" in r.case]
    assert count_rule.passed, count_rule.line()
    failures = [r.line() for r in results if not r.passed]
    assert any("(key 1 is the first that differs)" in line for line in failures), "\n".join(failures)


def test_the_graders_own_work_does_not_count_against_the_learner(monkeypatch):
    """Found by a learner walk: a correct block_keys timed out on a busy machine, because the case's own
    engine run counted against the learner's 10 s; the limit now bounds each call of the learner's code."""
    ex = Exercise("zz.slow_grader", "ch02_slot_utilisation", "slot_utilisation", time_limit_s=0.3)

    @ex.case
    def slow_setup_then_a_quick_call(fn):
        """A case whose own work outlasts the learner's limit."""
        time.sleep(0.6)  # the grader running an engine to compare with, say
        expect(call("fn()", 1, fn) == 1, "fn()", 1, "something else")

    monkeypatch.setitem(EXERCISES, ex.name, ex)
    (result,) = run(ex.name, lambda: 1)
    assert result.passed, result.line()


def test_a_grader_too_slow_for_the_machine_is_not_blamed_on_the_learner(monkeypatch):
    ex = Exercise("zz.stuck_grader", "ch02_slot_utilisation", "slot_utilisation", time_limit_s=0.3)

    @ex.case
    def stuck(fn):
        """A case whose own work never ends."""
        while True:
            time.sleep(0.05)

    monkeypatch.setitem(EXERCISES, ex.name, ex)
    monkeypatch.setattr(Exercise, "case_limit_s", property(lambda self: 0.5))
    monkeypatch.setattr(core, "_NOT_THEIRS", (*core._NOT_THEIRS, str(Path(__file__).parent)))  # it is grader code
    (result,) = run(ex.name, lambda: 1)
    assert result.status == "timed out"
    assert "the grader's own work (not your code) did not finish within 0.5 s" in result.got
    assert "endless loop" not in result.line()
