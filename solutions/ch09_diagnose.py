"""Solution of `ch09.diagnose`."""

import math

from minillm.sim import lab


def diagnose(dashboard: dict) -> dict:
    d = dashboard
    # the requests a healthy server holds at once — Little's law: arrivals x the time each stays (its
    # tokens x a decode step) — with room for the bursts of Poisson arrivals
    inside = 3 * d["arrival_rate"] * d["output_tokens_p50"] * max(d["itl_p50_s"], d["step_p50_s"])
    if d["preemptions"] > 0 or d["refused"] > 0 or d["kv_usage_max"] > 0.95:
        # the cache filled up and running requests were evicted: blocks for the requests inside, each as
        # long as the longest prompt with its answer
        per_request = math.ceil((d["prompt_tokens_max"] + 2 * d["output_tokens_p50"]) / lab.BLOCK_SIZE)
        return {"cause": lab.CAUSES[1], "fix": {"num_blocks": min(65_536, math.ceil(max(16, inside) * per_request))}}
    if d["waiting_max"] > 2 * d["running_max"]:
        # a queue behind a batch that never grew, while the cache had room: the slots are the limit
        return {"cause": lab.CAUSES[0], "fix": {"max_num_seqs": max(16, math.ceil(inside))}}
    if d["system_prompt_tokens"] > 0 and d["prefix_hit_rate"] < 0.05:
        # every prompt starts with the same tokens, and none of them was found cached
        return {"cause": lab.CAUSES[3], "fix": {"prefix_cache": True}}
    # the gaps' tail is a step that ran a whole long prompt: chunks small enough for the ITL target (a
    # decode step, plus up to three prompts' chunks in one step), in whole blocks — but at least 32
    # tokens: a long prompt cut into tiny chunks takes so many steps that its TTFT misses
    chunk = (d["slo_itl_p99_s"] - d["step_p50_s"]) / (3 * lab.COURSE_STEP_TIME.per_prompt_token)
    return {"cause": lab.CAUSES[2],
            "fix": {"chunked_prefill": True, "max_tokens_per_prefill_chunk": max(32, int(chunk) // 16 * 16)}}
