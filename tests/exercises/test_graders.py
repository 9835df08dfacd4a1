"""Every grader passes on `solutions/` and fails on the untouched `exercises/` stubs."""

import importlib

import pytest

from tests.exercises.graders import EXERCISES, GRADERS, check, run


def implementation(package: str, name: str):
    module, function = EXERCISES[name]
    return getattr(importlib.import_module(f"{package}.{module}"), function)


@pytest.mark.parametrize("name", sorted(GRADERS))
def test_graders_pass_on_the_solution(name):
    failures = [(case, msg) for case, ok, msg in run(name, implementation("solutions", name)) if not ok]
    assert not failures


@pytest.mark.parametrize("name", sorted(GRADERS))
def test_graders_fail_on_the_untouched_stub(name):
    results = run(name, implementation("exercises", name))
    assert results and not any(ok for _, ok, _ in results)
    assert all("not implemented" in msg for _, _, msg in results)


def test_a_wrong_answer_fails_with_a_useful_message(capsys):
    def keep_everything(logits, top_p):
        return logits

    check("ch01.top_p", keep_everything)
    out = capsys.readouterr().out
    assert "FAIL" in out and "transformers keeps" in out and "well done" not in out
    assert not all(ok for _, ok, _ in run("ch01.top_p", keep_everything))


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="ch01.top_p"):
        run("ch99.nothing", print)
