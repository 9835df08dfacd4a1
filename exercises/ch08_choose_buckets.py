"""Chapter 8 exercise `ch08.buckets`: choose the batch sizes to record under a memory budget."""


def choose_buckets(seen: dict[int, int], capture_mib: dict[int, float], budget_mib: float,
                   graph_ms: dict[int, float], eager_ms: dict[int, float]) -> list[int]:
    """The buckets to record for a server, from what it saw and what each bucket would cost.

    seen: batch size -> how many decode steps the server ran at that size. capture_mib: bucket ->
    the memory its recording keeps (the keys are the only buckets you may choose). budget_mib: the
    memory all chosen buckets may keep together. graph_ms: bucket -> the time of a step replayed
    from that bucket (its padding rows included). eager_ms: batch size -> the time of an eager step
    of that many requests (every size in `seen` is a key).
    A step of n requests runs the smallest chosen bucket >= n, costing graph_ms[bucket]; a step
    above the largest chosen bucket runs eagerly, costing eager_ms[n].
    Return the chosen buckets, sorted, each once: the choice whose capture memory fits the budget
    and whose mean step time over the steps seen is lowest; among equally fast choices, the one
    that keeps the least memory. [] (every step eager) is a choice too.
    Example: seen {1: 600, 3: 300, 12: 100}, capture_mib {1: 9, 2: 10, 4: 12, 8: 16, 16: 24},
    budget 40, graph_ms[b] = 1 + 0.02 b, eager_ms[n] = 3 + 0.02 n -> [4, 16] (a mean step of
    1.104 ms). Do not modify the arguments.
    """
    raise NotImplementedError("ch08.buckets: weigh each choice of buckets that fits the budget by its mean step time")
