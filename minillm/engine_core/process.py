"""One engine core process and its two pipes, as the front end holds it.

    core = CoreProcess(StartCore(model, config, os.getpid(), ...))   # starts `python -m minillm.engine_core.core`
    ready = core.wait_until_ready()                                  # CoreReady, or the core's own error
    core.send(AddRequest(...))                                       # from a sending thread: never blocks
    core.from_core                                                   # its CoreSteps, read by the front end
    core.stop()                                                      # Shutdown, then a kill if it lingers

A fresh interpreter, not multiprocessing's spawn: nothing of the front end's process is imported
again there, so a script needs no `if __name__ == "__main__"` guard. The core's ends of the pipes are
closed here once it has them: when it exits, reading from it ends (EOF) instead of waiting forever.
A front end may hold several (a disaggregated pair: chapter 13).
"""

from __future__ import annotations

import multiprocessing
import queue
import subprocess
import sys
import threading
import weakref

from minillm.engine_core.messages import CoreFailed, CoreReady, Shutdown, StartCore

START_POLL_S = 0.1  # how often the front end checks on a core that is still loading


class CoreProcess:
    def __init__(self, start: StartCore, name: str = "engine core"):
        self.name = name
        inbox, to_core = multiprocessing.Pipe(duplex=False)
        from_core, outbox = multiprocessing.Pipe(duplex=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "minillm.engine_core.core", str(inbox.fileno()), str(outbox.fileno())],
            pass_fds=(inbox.fileno(), outbox.fileno()))
        inbox.close()
        outbox.close()
        to_core.send(start)
        self.from_core = from_core
        self.outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self.stop = weakref.finalize(self, _stop_core, self.process, self.outgoing)
        threading.Thread(target=_send_forever, args=(to_core, self.outgoing), name="minillm-to-core",
                         daemon=True).start()

    def send(self, message) -> None:
        self.outgoing.put(message)

    def wait_until_ready(self) -> CoreReady:
        """The core's CoreReady once it has loaded its model; its own error if it could not start."""
        while (ready := self.poll_ready(START_POLL_S)) is None:
            pass
        return ready

    def poll_ready(self, timeout: float = 0.0) -> CoreReady | None:
        """The core's CoreReady if it says it within `timeout` seconds, else None (still loading); its own error
        if it could not start. A front end over several cores polls each in turn."""
        if not self.from_core.poll(timeout):
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.name} process exited while starting (exit code "
                                   f"{self.process.returncode})")
            return None
        try:
            message = self.from_core.recv()
        except EOFError:
            raise RuntimeError(f"the {self.name} process exited while starting (exit code "
                               f"{self.exit_code()})") from None
        if isinstance(message, CoreFailed):
            raise message.error
        return message

    def exit_code(self) -> int | None:
        """The process's exit code, waiting a moment for it (its pipe closes just before it is reaped)."""
        try:
            return self.process.wait(1)
        except subprocess.TimeoutExpired:
            return None


def _send_forever(connection, outgoing: queue.SimpleQueue) -> None:
    """The sending thread: the event loop never waits on a full pipe (the core may be busy sending too)."""
    while (message := outgoing.get()) is not None:
        try:
            connection.send(message)
        except (OSError, ValueError):  # the core is gone: the reader sees it end
            return


def _stop_core(process: subprocess.Popen, outgoing: queue.SimpleQueue) -> None:
    """Ask the core to end, then make sure it did."""
    outgoing.put(Shutdown())
    outgoing.put(None)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
