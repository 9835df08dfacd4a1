"""Chapter 9's cases: `ch09.diagnose`, the diagnosis lab — for each server, diagnose() reads its
dashboard alone, names the cause, and changes one setting; the server run again with that change
meets its SLO (minillm/sim/lab.py). The notebook's servers, and servers it does not show."""

from __future__ import annotations

from collections.abc import Callable

from exercises.grading.core import call, exercise, expect, fail
from minillm.sim import lab
from minillm.sim.lab import Slo

diagnose = exercise("ch09.diagnose", "ch09_diagnose", "diagnose")
CHUNKING = {"chunked_prefill", "max_tokens_per_prefill_chunk"}
SLOTS, KV, STALL, PREFIX = lab.CAUSES
# the answers, kept here, out of what the notebook shows:
#   a, h   the KV cache fills up (usage at 100%) and running requests are preempted, so few run and a queue grows
#   c, f   a queue grows behind a batch that never gets bigger, while the KV cache stays mostly empty
#   d, e   a good median ITL and a p99 as long as a step that ran a whole long prompt; nothing queues
#   b, g   every prompt starts with the same system prompt, and the prefix cache finds none of it
CAUSE_OF = {"server_a": KV, "server_b": PREFIX, "server_c": SLOTS, "server_d": STALL, "server_e": STALL,
            "server_f": SLOTS, "server_g": PREFIX, "server_h": KV}
# servers the notebook never shows, made the same way: a table of the notebook's answers cannot pass them
UNSEEN = {"unseen server 1": (lab.build_server("max_num_seqs", 1, Slo(ttft_p99_s=0.4, itl_p99_s=0.06)), SLOTS),
          "unseen server 2": (lab.build_server("num_blocks", 4, Slo(ttft_p99_s=0.8, itl_p99_s=0.095)), KV),
          "unseen server 3": (lab.build_server("chunked_prefill", 1, Slo(ttft_p99_s=1.4, itl_p99_s=0.105)), STALL),
          "unseen server 4": (lab.build_server("prefix_cache", 6, Slo(ttft_p99_s=0.4, itl_p99_s=0.05)), PREFIX),
          # a tighter ITL target: a chunk of 160 tokens or more misses it (32 to 128 pass), so the chunk size
          # must come from the step cost and the target, not be a fixed guess
          "unseen server 5": (lab.build_server("chunked_prefill", 13, Slo(ttft_p99_s=1.4, itl_p99_s=0.045)), STALL)}


def brief(dashboard: dict) -> str:
    """A dashboard in one line (what an unseen server's FAIL shows of it)."""
    return ", ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in dashboard.items())


def contradiction(board: dict, named: str) -> str | None:
    """The symptom of `board` that rules the cause `named` out, in numbers — never the right cause's
    name (a FAIL points at what to read again, not at the answer); None if nothing does."""
    ms = lambda seconds: f"{1e3 * seconds:.0f} ms"  # noqa: E731
    full = board["preemptions"] > 0 or board["refused"] > 0 or board["kv_usage_max"] > 0.95
    if named == SLOTS:
        if full:
            return (f"{board['preemptions']} preemptions and KV use up to {board['kv_usage_max']:.0%} while at most "
                    f"{board['running_max']} requests ran: the slots were not what ran out")
        if board["waiting_max"] <= 2 * board["running_max"]:
            return (f"the queue never passed {board['waiting_max']} while up to {board['running_max']} requests ran: "
                    "requests were not waiting for a slot")
    elif named == KV:
        if not full:
            return (f"no preemptions, nothing refused, and KV use at most {board['kv_usage_max']:.0%}: the cache "
                    "never filled")
    elif named == STALL:
        if board["itl_p99_s"] <= board["slo_itl_p99_s"]:
            return (f"ITL p99 {ms(board['itl_p99_s'])} is within its {ms(board['slo_itl_p99_s'])} target: no step "
                    f"stalled the decodes for long; what misses is TTFT p99, {board['ttft_p99_s']:.2f} s against "
                    f"{board['slo_ttft_p99_s']} s")
        if board["system_prompt_tokens"] > 0 and board["prefix_hit_rate"] < 0.05:
            return (f"every prompt starts with the same {board['system_prompt_tokens']} tokens, yet the prefix cache "
                    f"found {board['prefix_hit_rate']:.0%} of the prompt tokens: look at what those long steps "
                    "compute")
    elif named == PREFIX:
        if board["system_prompt_tokens"] == 0:
            return "system_prompt_tokens is 0: no two prompts share a start that a cache could keep"
        if board["prefix_hit_rate"] >= 0.05:
            return (f"the prefix cache found {board['prefix_hit_rate']:.0%} of the prompt tokens: the shared start is "
                    "cached and reused")
    return None


def _case(name: str, server: str | lab.Scenario, cause_of: str) -> None:
    shown = isinstance(server, str)
    slo = lab.SERVERS[server].slo if shown else server.slo

    def case(impl: Callable) -> None:
        board = lab.dashboard(server)  # a fresh copy: what the learner's code does to it stays there
        given = (f"diagnose(lab.dashboard({server!r}))" if shown
                 else f"diagnose(the dashboard of {name}: {brief(board)})")
        answer = call(given, "a diagnosis {'cause': ..., 'fix': {...}} read from the dashboard alone", impl, board)
        expect(isinstance(answer, dict) and "cause" in answer and "fix" in answer, given,
               "a dict {'cause': one of lab.CAUSES, 'fix': {setting: value}}", repr(answer))
        named, changed = answer["cause"], answer["fix"]
        expect(named in lab.CAUSES, f"{given}['cause']", f"one of {lab.CAUSES}", repr(named))
        why = contradiction(lab.dashboard(server), named) if named != cause_of else None  # a copy the learner never had
        expect(named == cause_of, f"{given}['cause']",
               "the cause its symptoms point to (which number is far from what a healthy server shows?)",
               f"{named!r}, which the dashboard rules out: {why}" if why else repr(named))
        expect(isinstance(changed, dict), f"{given}['fix'] (the cause is right)", "a dict {setting: value}",
               repr(changed))
        keys = set(changed)
        expect(keys and (len(keys) == 1 or keys == CHUNKING) and keys <= set(lab.SETTINGS),
               f"{given}['fix'] (the cause is right)",
               f"one setting of {lab.SETTINGS} (chunked prefill may bring its chunk size)", repr(changed))
        try:
            lab.check_fix(changed)
        except (TypeError, ValueError) as err:
            fail(f"{given}['fix'] (the cause is right)", "settings of the right type, within the lab's ranges",
                 str(err))
        seen = lab.dashboard(server, changed)
        expect(lab.meets_slo(server, changed), f"{name} run again with {changed!r} (the cause is right)",
               f"the SLO met: every request served, TTFT p99 <= {slo.ttft_p99_s} s and ITL p99 <= {slo.itl_p99_s} s",
               f"{seen['refused']} requests refused, TTFT p99 {seen['ttft_p99_s']:.3f} s, ITL p99 "
               f"{seen['itl_p99_s']:.3f} s")

    case.__doc__ = f"{name}: the cause from its dashboard, and one change that meets its SLO"
    diagnose.case(case)


for _name in lab.SERVERS:
    _case(_name, _name, CAUSE_OF[_name])
for _name, (_server, _cause) in UNSEEN.items():
    _case(_name, _server, _cause)
