"""Solution of `ch10.front_ends`."""

import math


def front_end_processes(step_ms, front_ms_per_token, front_ms_per_request, output_tokens, max_num_seqs, cores):
    # per step: one token of every running request, and the requests that end (as many arrive) in a step
    work = max_num_seqs * front_ms_per_token + max_num_seqs / output_tokens * front_ms_per_request
    needed = max(1, math.ceil(work / step_ms - 1e-9))  # a hair of float noise must not ask for one more
    return needed if needed <= cores - 1 else None
