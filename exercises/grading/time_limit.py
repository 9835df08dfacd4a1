"""A time limit on one grading case, so that an endless loop in a learner's code fails the case
instead of hanging `check()` and `make grade`.

In the main thread of a POSIX process (a notebook's kernel, `make grade`) a timer signal raises
`TimeLimitExceeded` wherever the code is; elsewhere (another thread, Windows) the case runs in a
helper thread and the exception is sent into that thread. Either way the exception arrives between
two Python instructions: it stops a Python loop, not a single call stuck in C code.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Callable
from typing import Any


class TimeLimitExceeded(BaseException):
    """The case ran past its time limit. A BaseException, so that a learner's `except Exception:`
    inside the loop cannot swallow it."""


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn(), stopped with TimeLimitExceeded after `seconds`."""
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _with_timer_signal(seconds, fn)
    return _in_helper_thread(seconds, fn)


def _with_timer_signal(seconds: float, fn: Callable[[], Any]) -> Any:
    def stop(signum, frame):
        raise TimeLimitExceeded(f"stopped after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)  # and again every 0.5 s, should the code catch it
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_helper_thread(seconds: float, fn: Callable[[], Any]) -> Any:
    outcome: dict[str, Any] = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as err:  # handed back to the caller's thread below
            outcome["error"] = err

    worker = threading.Thread(target=target, name="grading-case", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(TimeLimitExceeded))
        worker.join(1.0)
        if worker.is_alive():  # stuck inside one C call: it is left behind, a daemon
            raise TimeLimitExceeded(f"stopped after {seconds:g} s (the code is still running in the background)")
        error = outcome.get("error")
        if isinstance(error, TimeLimitExceeded):
            raise TimeLimitExceeded(f"stopped after {seconds:g} s").with_traceback(error.__traceback__)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
