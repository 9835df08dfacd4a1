"""Chapter 9's cases: `ch09.diagnose`, the diagnosis lab — for each scenario, the cause named and a
one-setting fix that meets the scenario's SLO when the scenario is run again (minillm/sim/lab.py)."""

from __future__ import annotations

from collections.abc import Callable

from exercises.grading.core import call, exercise, expect, fail
from minillm.sim import lab

diagnose = exercise("ch09.diagnose", "ch09_diagnose", "diagnose")
CHUNKING = {"chunked_prefill", "max_tokens_per_prefill_chunk"}
CAUSE_OF = {"queueing": lab.CAUSES[0], "preemption": lab.CAUSES[1], "long_prompts": lab.CAUSES[2],
            "shared_prompt": lab.CAUSES[3]}  # the answers: kept here, out of the scenarios the notebook shows


def _answer(impl: Callable, name: str) -> dict:
    answers = call("diagnose()", "a dict of your diagnoses", impl)
    expect(isinstance(answers, dict), "diagnose()", "a dict {scenario: {'cause': ..., 'fix': {...}}}", repr(answers))
    answer = answers.get(name)
    expect(isinstance(answer, dict) and isinstance(answer.get("fix"), dict), f"diagnose()[{name!r}]",
           "{'cause': one of lab.CAUSES, 'fix': {setting: value}}", repr(answer))
    return answer


def _case(name: str) -> None:
    scenario = lab.SCENARIOS[name]

    def cause(impl: Callable) -> None:
        answer = _answer(impl, name)
        expect(answer.get("cause") in lab.CAUSES, f"diagnose()[{name!r}]['cause']", f"one of {lab.CAUSES}",
               repr(answer.get("cause")))
        expect(answer["cause"] == CAUSE_OF[name], f"diagnose()[{name!r}]['cause']",
               "the cause its symptoms point to (read lab.symptoms again: which number is far off?)",
               repr(answer["cause"]))

    def fix(impl: Callable) -> None:
        changed = _answer(impl, name)["fix"]
        keys = set(changed)
        expect(keys and (len(keys) == 1 or keys == CHUNKING) and keys <= set(lab.SETTINGS),
               f"diagnose()[{name!r}]['fix']", f"one setting of {lab.SETTINGS} (chunked prefill may bring its chunk "
               "size)", repr(changed))
        try:
            lab.check_fix(changed)
        except (TypeError, ValueError) as err:
            fail(f"diagnose()[{name!r}]['fix']", "settings of the right type, within the lab's ranges", str(err))
        result = call(f"lab.run({name!r}, {changed!r})", "a run", lab.run, name, changed)
        s = lab.symptoms(result)
        expect(lab.meets_slo(name, result), f"lab.run({name!r}, {changed!r})",
               f"the SLO met: TTFT p99 <= {scenario.slo.ttft_p99_s} s and ITL p99 <= {scenario.slo.itl_p99_s} s",
               f"TTFT p99 {s['ttft_p99_s']:.3f} s, ITL p99 {s['itl_p99_s']:.3f} s")

    cause.__doc__ = f"{name}: the cause is named"
    fix.__doc__ = f"{name}: one setting changed, and the run meets its SLO"
    diagnose.case(cause)
    diagnose.case(fix)


for _name in lab.SCENARIOS:
    _case(_name)
