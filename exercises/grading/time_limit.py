"""A time limit on one grading case, so that an endless loop in a learner's code fails the case
instead of hanging `check()` and `make grade`.

In the main thread of a POSIX process (a notebook's kernel, `make grade`) a timer signal raises
`TimeLimitExceeded` wherever the code is; elsewhere (another thread, Windows) the case runs in a
helper thread and the exception is sent into that thread. Either way the exception arrives between
two Python instructions: it stops a Python loop, not a single call stuck in C code.
"""

from __future__ import annotations

import contextvars
import ctypes
import signal
import threading
import time
from collections.abc import Callable
from typing import Any


class TimeLimitExceeded(BaseException):
    """The case ran past its time limit. A BaseException, so that a learner's `except Exception:`
    inside the loop cannot swallow it."""


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn(), stopped with TimeLimitExceeded after `seconds`. Limits nest: inside another `within`,
    whichever deadline comes first stops it."""
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _with_timer_signal(seconds, fn)
    return _in_helper_thread(seconds, fn)


def _with_timer_signal(seconds: float, fn: Callable[[], Any]) -> Any:
    """The timer signal's own clock holds the deadlines: an enclosing limit's time left is read from
    it before this one is armed, and given back (less the time spent here) afterwards."""
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.getsignal(signal.SIGALRM)
    mine = not outer_left or seconds <= outer_left  # else the enclosing deadline comes first

    def stop(signum, frame):
        if mine or not callable(previous):
            raise TimeLimitExceeded(f"stopped after {seconds:g} s")
        previous(signum, frame)  # the enclosing limit's time is up: its handler says so

    started = time.perf_counter()
    signal.signal(signal.SIGALRM, stop)
    # fire at the nearer deadline, then again every 0.5 s should the code catch the exception
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left else seconds, 0.5)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:  # the enclosing limit goes on with what is left of it (at once if nothing is)
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.perf_counter() - started), 1e-3), 0.5)


def _in_helper_thread(seconds: float, fn: Callable[[], Any]) -> Any:
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()  # a thread starts with an empty context: take the caller's

    def target():
        try:
            outcome["value"] = context.run(fn)
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
