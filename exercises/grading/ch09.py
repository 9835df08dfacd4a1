"""Chapter 9's cases: `ch09.diagnose`, the diagnosis lab — for each scenario, the cause named and a
one-setting fix that meets the scenario's SLO when the scenario is run again (minillm/sim/lab.py)."""

from __future__ import annotations

from collections.abc import Callable

from exercises.grading.core import RUN_MEMO, call, exercise, expect, fail
from minillm.sim import lab

diagnose = exercise("ch09.diagnose", "ch09_diagnose", "diagnose")
CHUNKING = {"chunked_prefill", "max_tokens_per_prefill_chunk"}
# the answers, kept here, out of what the notebook shows:
#   server_a  preemptions by the hundred, few requests running: the KV cache is too small
#   server_b  TTFT high though little queues, almost every token a prompt token: the same prefix recomputed
#   server_c  a queue of hundreds behind 2 busy slots: too few slots
#   server_d  a good median ITL, a terrible p99 as long as the longest step: a whole long prefill in one step
CAUSE_OF = {"server_a": lab.CAUSES[1], "server_b": lab.CAUSES[3], "server_c": lab.CAUSES[0],
            "server_d": lab.CAUSES[2]}


def _answers(impl: Callable) -> dict:
    """diagnose()'s answers, called once for all the cases of one check (it may run the lab itself)."""
    if "ch09.diagnose" not in RUN_MEMO:
        RUN_MEMO["ch09.diagnose"] = call("diagnose()", "a dict of your diagnoses", impl)
    answers = RUN_MEMO["ch09.diagnose"]
    expect(isinstance(answers, dict), "diagnose()", "a dict {scenario: {'cause': ..., 'fix': {...}}}", repr(answers))
    return answers


def _answer(impl: Callable, name: str, part: str) -> object:
    answer = _answers(impl).get(name)
    expect(isinstance(answer, dict) and part in answer, f"diagnose()[{name!r}]",
           "{'cause': one of lab.CAUSES, 'fix': {setting: value}}", repr(answer))
    return answer[part]


def _case(name: str) -> None:
    scenario = lab.SCENARIOS[name]

    def cause(impl: Callable) -> None:
        named = _answer(impl, name, "cause")
        expect(named in lab.CAUSES, f"diagnose()[{name!r}]['cause']", f"one of {lab.CAUSES}", repr(named))
        expect(named == CAUSE_OF[name], f"diagnose()[{name!r}]['cause']",
               "the cause its symptoms point to (read lab.symptoms again: which number is far off?)", repr(named))

    def fix(impl: Callable) -> None:
        changed = _answer(impl, name, "fix")
        expect(isinstance(changed, dict), f"diagnose()[{name!r}]['fix']", "a dict {setting: value}", repr(changed))
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
               f"the SLO met: every request served, TTFT p99 <= {scenario.slo.ttft_p99_s} s and ITL p99 <= "
               f"{scenario.slo.itl_p99_s} s",
               f"{s['refused']} requests refused, TTFT p99 {s['ttft_p99_s']:.3f} s, ITL p99 {s['itl_p99_s']:.3f} s")

    cause.__doc__ = f"{name}: the cause is named"
    fix.__doc__ = f"{name}: one setting changed, and the run meets its SLO"
    diagnose.case(cause)
    diagnose.case(fix)


for _name in lab.SCENARIOS:
    _case(_name)
