"""Solution of `ch08.buckets`."""

import itertools
import math


def choose_buckets(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    def mean_step_ms(buckets):
        total = 0.0
        for n, steps in seen.items():
            bucket = next((b for b in buckets if b >= n), None)  # the smallest chosen bucket that holds n
            total += steps * (eager_ms[n] if bucket is None else graph_ms[bucket])  # none: the step runs eagerly
        return total / sum(seen.values())

    best, best_ms, best_mib = [], mean_step_ms([]), 0.0
    candidates = sorted(capture_mib)
    for size in range(1, len(candidates) + 1):  # a few candidates: weigh every choice that fits
        for buckets in itertools.combinations(candidates, size):
            mib = sum(capture_mib[b] for b in buckets)
            if mib > budget_mib:
                continue
            ms = mean_step_ms(buckets)
            faster = ms < best_ms and not math.isclose(ms, best_ms)
            if faster or (math.isclose(ms, best_ms) and mib < best_mib):
                best, best_ms, best_mib = list(buckets), ms, mib
    return best
