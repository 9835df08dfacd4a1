"""Chapter 9 exercise `ch09.diagnose`: the diagnosis lab (minillm/sim/lab.py)."""


def diagnose(dashboard: dict) -> dict:
    """Diagnose one lab server from its dashboard alone.

    `dashboard` is what `lab.dashboard(name)` returns: the keys of `lab.DASHBOARD` — the workload as
    its team describes it, the SLO, and what the server did over its run. It never shows the
    server's settings (reading one is a KeyError): the cause must be read from the symptoms.

    Return {"cause": one of lab.CAUSES (the exact text), "fix": {setting: value}}: ONE setting of
    lab.SETTINGS changed — except that turning on chunked prefill may also set its chunk size
    ("chunked_prefill" with "max_tokens_per_prefill_chunk"). No setting's current value is shown:
    choose the new one from the dashboard (`lab.COURSE_STEP_TIME` is the servers' step time,
    `lab.BLOCK_SIZE` their tokens per KV block). The grader diagnoses the notebook's servers and
    servers the notebook does not show, runs each with your fix, and checks its SLO: every request
    served, TTFT p99 and ITL p99 within the targets.
    """
    raise NotImplementedError("ch09.diagnose: read the dashboard's symptoms, name the cause, choose the one fix")
