"""An artificial CPU hog for the tests of live measurements (and, run as a script, for a walk through a
chapter on a busy machine): busy-loop processes, one per core by
default, that keep the machine as busy as a learner's video call and build would.

The loops must look like *other programs* to `minillm/timing.py::CpuWatch`, which counts this
process's children as its own work (a server a notebook started). So each loop is a grandchild
whose parent exits at once: it belongs to no process of ours, as a video call would not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

# fork, print the loop's pid, and leave it to spin on its own (POSIX)
SPIN = """
import os
pid = os.fork()
if pid:
    print(pid, flush=True)
    os._exit(0)
os.setsid()
quiet = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):  # let go of the launcher's pipes, so that it is seen to finish
    os.dup2(quiet, fd)
while True:
    pass
"""


@contextlib.contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[list[int]]:
    """Busy-loop processes (default: one per core), none of them ours, for the duration of the block.
    Yields their process ids."""
    pids: list[int] = []
    try:
        for _ in range(processes or os.cpu_count() or 1):
            launcher = subprocess.run([sys.executable, "-c", SPIN], capture_output=True, text=True, timeout=60,
                                      check=True)
            pids.append(int(launcher.stdout.strip()))
        time.sleep(0.3)  # let them get going
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":  # `python tests/cpu_hog.py [PROCESSES]`: busy cores until Ctrl-C (a learner walk's load)
    count = int(sys.argv[1]) if len(sys.argv) > 1 else None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops them too, like Ctrl-C
    with cpu_hog(count) as hogs:
        print(f"{len(hogs)} busy-loop process(es) running: {hogs}; Ctrl-C stops them", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
