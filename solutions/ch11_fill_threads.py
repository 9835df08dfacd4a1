"""Solution of `ch11.fill_threads`."""

import math


def fill_threads(fill_ms_per_row, fixed_ms, batch, forward_ms, handoff_ms, max_threads):
    best, best_wait = 1, math.inf
    for threads in range(1, max_threads + 1):
        filling = fixed_ms + math.ceil(batch / threads) * fill_ms_per_row + (threads * handoff_ms if threads > 1
                                                                              else 0.0)
        wait = max(0.0, filling - forward_ms)
        if wait < best_wait - 1e-9:  # strictly less: among equal waits the fewest threads stay
            best, best_wait = threads, wait
    return best
