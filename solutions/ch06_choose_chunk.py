"""Chapter 6 exercise `ch06.choose_chunk`: the chunk size for an inter-token-latency target, from the
fitted step-cost model (reference solution)."""


def prefill_steps(cost: tuple[float, float, float], decode_contexts: list[int], prompt_len: int,
                  size: int) -> list[float]:
    """The time of every step of the prompt's prefill in chunks of `size`."""
    p0, p1, p2 = cost
    times, start, step = [], 0, 0
    while start < prompt_len:
        n = min(size, prompt_len - start)
        tokens = len(decode_contexts) + n  # the decodes ride along in every step
        pairs = sum(c + step for c in decode_contexts) + n * start + n * (n + 1) // 2  # later chunks see more
        times.append(p0 + p1 * tokens + p2 * pairs)
        start, step = start + n, step + 1
    return times


def choose_chunk(cost: tuple[float, float, float], decode_contexts: list[int], prompt_len: int,
                 itl_target: float, sizes: list[int]) -> int | None:
    """The chunk size from `sizes` that gives the long prompt its earliest first token while no step
    of its prefill takes longer than `itl_target`; None if no size keeps every step within it."""
    within = {}  # size -> (the first token's time: the end of the prompt's last step, its heaviest step)
    for size in sizes:
        times = prefill_steps(cost, decode_contexts, prompt_len, size)
        if max(times) <= itl_target:  # every step, not only the last: a short last chunk is a light step
            within[size] = (sum(times), max(times))
    if not within:
        return None
    earliest = min(ttft for ttft, _ in within.values())
    # sizes that cut the prompt into as many steps tie (its own tokens and pairs are the same however it
    # is cut; each step pays p0 and the decodes): of those, the lightest heaviest step, then the smaller size
    tied = {size: heaviest for size, (ttft, heaviest) in within.items() if ttft <= earliest + 1e-9 * abs(earliest)}
    return min(tied, key=lambda size: (tied[size], size))
