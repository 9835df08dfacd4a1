"""An artificial CPU hog for the tests of live measurements: busy-loop processes, one per core by
default, that keep the machine as busy as a learner's video call and build would."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator


def _spin(started) -> None:
    started.release()
    while True:
        pass


@contextlib.contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[None]:
    """Busy-loop processes (default: one per core) for the duration of the block."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
    started = context.Semaphore(0)
    count = processes or os.cpu_count() or 1
    hogs = [context.Process(target=_spin, args=(started,), daemon=True) for _ in range(count)]
    for hog in hogs:
        hog.start()
    for _ in hogs:  # every hog is spinning before the block starts
        started.acquire(timeout=60)
    time.sleep(0.2)
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.join()
