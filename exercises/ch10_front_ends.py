"""Chapter 10 exercise `ch10.front_ends`: how many front-end processes keep up with one engine core."""


def front_end_processes(step_ms: float, front_ms_per_token: float, front_ms_per_request: float,
                        output_tokens: int, max_num_seqs: int, cores: int) -> int | None:
    """The fewest front-end processes with which the front end keeps pace with the engine core.

    The server is saturated: every step of the core decodes `max_num_seqs` requests, one token each, and
    takes `step_ms`. Every request generates `output_tokens` tokens, so in the steady state as many
    requests end (and new ones arrive) per step as max_num_seqs / output_tokens. The front end spends
    `front_ms_per_token` on each token (detokenize, stop strings, its SSE line) and `front_ms_per_request`
    on each request once (receive, tokenize, the last response). Requests are spread evenly over the
    front-end processes, each on a core of its own; the engine core process keeps one of the machine's
    `cores` busy for itself.
    Return the fewest processes P (1 <= P <= cores - 1) whose work per step, each, fits within one step;
    None when even cores - 1 processes cannot keep up (or no core is left for a front end).
    Example: step_ms 10, 0.05 ms per token, 2 ms per request, 100 tokens, 256 requests, 8 cores ->
    work per step 256 x 0.05 + 2.56 x 2 = 17.92 ms -> 2 processes (8.96 ms each).
    """
    raise NotImplementedError("ch10.front_ends: the front end's work per step, shared by P processes, within a step")
