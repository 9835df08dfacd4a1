"""Chapter 11 exercise `ch11.fill_threads`: how many threads should fill a step's masks beside its forward pass."""


def fill_threads(fill_ms_per_row: float, fixed_ms: float, batch: int, forward_ms: float, handoff_ms: float,
                 max_threads: int) -> int:
    """The number of threads, T (1 <= T <= max_threads), that should fill the step's bitmask.

    The engine launches the step's forward pass on the device, fills the masks on the host meanwhile (as
    vLLM's engine core does), then samples — and sampling needs the masks. With T threads the `batch` rows
    are shared as evenly as possible, so filling takes
        fixed_ms + ceil(batch / T) * fill_ms_per_row + (T * handoff_ms if T > 1 else 0)
    — T = 1 is the engine's own thread; more threads each cost `handoff_ms` (handing them their rows and
    waiting for them). The step waits max(0, filling - forward_ms) for the masks.
    Return the T with the least wait; among equal waits (within 1e-9 ms), the fewest threads.
    Example: 0.005 ms per row, 0.05 ms fixed, batch 512, a 1 ms forward, 0.03 ms handoff, 8 threads ->
    T = 1 fills in 2.61 ms (waits 1.61), T = 2 in 1.39 ms (waits 0.39), T = 3 in 0.995 ms (no wait) -> 3.
    Errors: none to raise.
    """
    raise NotImplementedError("ch11.fill_threads: weigh the rows each thread fills against what a thread costs")
