"""Timing on a machine that may be busy: the configurations being compared run interleaved and
repeated, each comparison is the median of per-round ratios, and a guard says when the numbers
cannot be trusted.

    round 1:  A B C        each round runs every configuration once, back to back, in an order
    round 2:  B C A        rotated from round to round; a ratio A/B is taken *within* a round
    round 3:  C A B        (A and B ran seconds apart), and the median over rounds is quoted

Other programs can only make a run slower, and they come and go: a burst that lands on one run of
A spoils one round's ratio, not the median. What the median cannot survive is a machine that is
busy all along, or so unevenly that the rounds disagree — the guard (`Trials.warning`) catches both:
the CPU time other processes used while the rounds ran (`CpuUse`, read from the operating system),
and comparisons whose rounds point different ways.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import psutil
import torch

T = TypeVar("T")
Metric = Callable[[T], float]  # reads a number (a time, a rate) out of one run's result

# Other processes may take this much of a core per thread of ours, on average, beyond the cores our threads
# leave free: a fifth of our compute. (One busy program per core beside our one thread on two cores takes
# 4/3 of them, a third of ours: busy. A browser's 0.3 of a core beside our two threads on two cores: not.)
SPARE_CORE_SLACK = 0.2
# A comparison is only as good as its rounds: the same configuration may vary this much (max / min).
MAX_SPREAD = 1.5


@dataclass(frozen=True)
class CpuUse:
    """What the machine did while some code ran: wall time, and the CPU seconds of this process
    (all its threads, its children and any `include`d process) against everyone else's."""

    wall_s: float
    ours_s: float
    others_s: float
    cores: int
    threads: int  # the threads our work asks for (torch's intra-op threads)

    @property
    def others_cores(self) -> float:
        """How many cores other programs kept busy, on average."""
        return self.others_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def spare_cores(self) -> float:
        """Cores our threads leave free: other programs may use those without slowing us."""
        return max(self.cores - self.threads, 0)

    @property
    def busy(self) -> bool:
        return self.others_cores > self.spare_cores + SPARE_CORE_SLACK * max(self.threads, 1)

    @property
    def free_cores(self) -> int:
        """The cores other programs left free, rounded (at least one): as many threads as fit beside them."""
        return max(1, int(self.cores - self.others_cores + 0.5))

    def describe(self) -> str:
        threads = f"{self.threads} thread{'s' * (self.threads != 1)}"
        spare = f"{self.spare_cores:g} core{'s' * (self.spare_cores != 1)}"
        needed = ("while our threads needed every core" if self.spare_cores == 0
                  else f"more than the {spare} left free by our {threads}")
        # other programs' CPU time over the wall time can pass the core count (the kernel's accounting is
        # coarse, and short bursts overlap): never say more cores than the machine has
        busy = min(self.others_cores, float(self.cores))
        return f"other programs kept {busy:.1f} of this machine's {self.cores} cores busy, {needed}"


class CpuWatch:
    """Measures the CPU use of a block: `with CpuWatch() as watch: ...`, then `watch.use`."""

    def __init__(self, include: Iterable[int] = ()):
        self.include = list(include)  # more process ids whose CPU counts as ours (a server we started)
        self.use: CpuUse | None = None

    def __enter__(self) -> CpuWatch:
        self._start = (time.perf_counter(), _busy_seconds(), self._ours())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, ours0 = self._start
        wall, busy, ours = time.perf_counter() - wall0, _busy_seconds() - busy0, self._ours() - ours0
        self.use = CpuUse(wall, ours, max(busy - ours, 0.0), psutil.cpu_count() or 1, torch.get_num_threads())

    def _ours(self) -> float:
        me = psutil.Process(os.getpid())
        procs = [me, *me.children(recursive=True)]
        for pid in self.include:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        total = 0.0
        for p in {p.pid: p for p in procs}.values():
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                t = p.cpu_times()
                total += t.user + t.system
        return total


def _busy_seconds() -> float:
    """CPU seconds every core of the machine has spent not idle, since boot."""
    t = psutil.cpu_times()
    return sum(getattr(t, name) for name in ("user", "nice", "system", "irq", "softirq", "steal") if hasattr(t, name))


@dataclass(frozen=True)
class PairedRatio:
    """num / den within each round, and their median: `value`. `what` names the metric (in the
    guard's words: "output throughput, heavy / light, went both ways"). `around`: the value the claim
    turns on (1: which is faster), that every round must fall on the same side of."""

    num: str
    den: str
    per_round: tuple[float, ...]
    what: str | None = None
    around: float = 1.0

    @property
    def value(self) -> float:
        return statistics.median(self.per_round)

    @property
    def agrees(self) -> bool:
        """Every round says the same: all above `around`, or all below (a tie counts with either side)."""
        return all(r >= self.around for r in self.per_round) or all(r <= self.around for r in self.per_round)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec or ".2f")

    def rounds(self, fmt: str | Callable[[float], str] = "{:.2f}x") -> str:
        """The per-round ratios for a sentence: "1.31x, 1.28x, 1.35x" (`fmt` a format string or a function)."""
        show = fmt.format if isinstance(fmt, str) else fmt
        return ", ".join(show(r) for r in self.per_round)


@dataclass
class Trials(Generic[T]):
    """Each configuration's results, one per round, and the machine's CPU use meanwhile."""

    results: dict[str, list[T]]
    cpu: CpuUse
    rerun: str = "this cell"  # what to rerun once the machine is quiet
    checked: list[PairedRatio] = field(default_factory=list)  # comparisons the warning looks at
    before: CpuUse | None = None  # the glance before the rounds, when it found the machine busy already

    @property
    def rounds(self) -> int:
        return len(next(iter(self.results.values())))

    def all_runs(self) -> list[T]:
        """Every result of every configuration (to check they all did the same work)."""
        return [run for results in self.results.values() for run in results]

    def values(self, name: str, metric: Metric | None = None) -> list[float]:
        """`name`'s rounds, each read through `metric` (the results themselves when they are numbers)."""
        return [(metric or float)(r) for r in self.results[name]]

    def best(self, name: str, metric: Metric | None = None) -> float:
        """The least disturbed round of `name`: the smallest value of a time-like metric."""
        return min(self.values(name, metric))

    def median(self, name: str, metric: Metric | None = None) -> float:
        return statistics.median(self.values(name, metric))

    def ratio(self, num: str, den: str, metric: Metric | None = None, *, what: str | None = None,
              around: float = 1.0) -> PairedRatio:
        """metric(num) / metric(den), round by round; the warning then checks that the rounds agree
        (all on one side of `around`: 1 asks which is faster; a claim like "under half" passes 0.5).
        A round whose `den` is 0 gives inf (or nan, when `num` is 0 too): it agrees with nothing."""
        per_round = tuple(a / b if b else (math.inf if a else math.nan)
                          for a, b in zip(self.values(num, metric), self.values(den, metric)))
        ratio = PairedRatio(num, den, per_round, what, around)
        self.checked.append(ratio)
        return ratio

    def spread(self, name: str, metric: Metric | None = None) -> float:
        """max / min of `name`'s rounds: 1.0 when every round took the same."""
        values = self.values(name, metric)
        return max(values) / min(values) if min(values) > 0 else float("inf")

    def problems(self, metric: Metric | None = None) -> list[str]:
        """Why these numbers may mean nothing (empty when they hold): the machine was busy, a
        comparison's rounds disagree, or (with `metric`) one configuration's rounds spread widely."""
        found = []
        if self.cpu.busy:
            found.append(self.cpu.describe())
        elif self.before is not None and self.before.busy:  # fewer threads may have hidden it from the rounds
            found.append("before the rounds, " + self.before.describe())
        for r in self.checked:
            if not r.agrees:
                shown = ", ".join(f"{x:.2f}" for x in r.per_round)
                named = f"{r.what}, {r.num} / {r.den}," if r.what else f"{r.num} / {r.den}"
                side = "" if r.around == 1 else f" of {r.around:g}"
                found.append(f"{named} went both ways{side} over the rounds ({shown})")
        if metric is not None:
            for name in self.results:
                if self.spread(name, metric) > MAX_SPREAD:
                    found.append(f"{name} varied {self.spread(name, metric):.1f}x from round to round")
        return found

    @property
    def trustworthy(self) -> bool:
        return not self.problems()

    def warning(self, metric: Metric | None = None) -> str | None:
        """The guard's words for the learner, or None when the numbers hold."""
        found = self.problems(metric)
        if not found:
            return None
        return ("⚠ Other work was running while this measured: " + "; ".join(found) + ". The numbers below "
                "can be off by a lot, either way, and so can what they seem to show: close other programs (a video "
                f"call, a build, many browser tabs) and rerun {self.rerun}.")


def interleaved(runs: Mapping[str, Callable[[], T]], rounds: int = 3, *, warmup: bool = False,
                rerun: str = "this cell", include: Sequence[int] = (), progress: bool = True) -> Trials[T]:
    """Run every configuration once per round, rotating the order each round; `warmup` first runs
    each once unrecorded. The machine's CPU use is watched over all the recorded rounds. With
    `progress`, it first says if the machine is busy already, then which round is running (one line,
    rewritten), then how long it all took."""
    if rounds < 1 or not runs:
        raise ValueError(f"need at least one round and one configuration, got {rounds} rounds, {len(runs)} runs")
    names = list(runs)
    threads = torch.get_num_threads()
    busy_before = None
    if progress:
        with CpuWatch(include) as glance:
            time.sleep(0.25)
        if glance.use is not None and glance.use.busy:
            busy_before = glance.use
            threads = min(threads, glance.use.free_cores)
            fewer = "" if threads == torch.get_num_threads() else (
                f" Meanwhile torch computes with {threads} thread{'s' * (threads != 1)} instead of "
                f"{torch.get_num_threads()}: one that waits for a busy core stalls every operation of the others.")
            print(textwrap.fill(f"⚠ Before measuring: {glance.use.describe()}. The timings below will be "
                                f"disturbed.{fewer}", 100), flush=True)
    results: dict[str, list[T]] = {name: [] for name in names}
    with torch_threads(threads):
        if warmup:
            for name in names:
                _say(progress, f"warming up: {name}")
                runs[name]()
        with CpuWatch(include) as watch:
            for r in range(rounds):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    _say(progress, f"measuring: round {r + 1} of {rounds}, {name}")
                    results[name].append(runs[name]())
    assert watch.use is not None
    _say(progress, f"measured {len(names)} configuration{'s' * (len(names) > 1)} x {rounds} "
                   f"round{'s' * (rounds > 1)} in {watch.use.wall_s:.1f} s", end="\n")
    return Trials(results, watch.use, rerun, before=busy_before)


def fit_threads(glance_s: float = 0.25) -> str | None:
    """For a notebook on a busy machine: torch's threads cut, for the rest of the session, to the cores other
    programs leave free — a thread that waits for a busy core stalls every operation of the others (chapter 12's
    walk measured a notebook 10x slower with two threads on two busy cores). Returns what it did, or None when
    the machine is quiet or the threads already fit."""
    with CpuWatch() as glance:
        time.sleep(glance_s)
    use = glance.use
    before = torch.get_num_threads()
    if use is None or not use.busy or use.free_cores >= before:
        return None
    torch.set_num_threads(use.free_cores)
    return (f"⚠ {use.describe()}. So torch computes with {use.free_cores} thread{'s' * (use.free_cores != 1)} "
            f"instead of {before} in this notebook (torch.set_num_threads): the cells run much faster than with "
            "threads waiting for busy cores, and the timed cells say what the load did to their numbers.")


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's intra-op threads set to `count` for the block, as they were after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _say(progress: bool, text: str, end: str = "") -> None:
    """One progress line, rewritten in place (a terminal and a notebook both honour the carriage return)."""
    if progress:
        print(f"\r{text[:96]:<96}", end=end, flush=True)
