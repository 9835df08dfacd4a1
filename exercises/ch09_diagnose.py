"""Chapter 9 exercise `ch09.diagnose`: the diagnosis lab (minillm/sim/lab.py)."""


def diagnose() -> dict[str, dict]:
    """Your diagnosis of each lab scenario: "server_a", "server_b", "server_c", "server_d".

    For each, run it (`minillm.sim.lab.run(name)`), read its symptoms (`lab.symptoms(result)`), find
    the cause, change settings and run again (`lab.run(name, fix)`) until `lab.meets_slo(name, result)`.
    Return {scenario: {"cause": one of lab.CAUSES (the exact text), "fix": {setting: value}}}, with
    settings from lab.SETTINGS. Change ONE setting per scenario — except that turning on chunked
    prefill may also set its chunk size ("chunked_prefill" with "max_tokens_per_prefill_chunk").
    """
    raise NotImplementedError("ch09.diagnose: read each scenario's symptoms, name the cause, find the one fix")
