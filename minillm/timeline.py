"""What the front end and the engine core did, span by span: the data chapter 10's two-lane timeline replays.

    front end  │tokenize│receive│      │detokenize│send to client│      │detokenize│send to client│
    core       │schedule│     forward     │sample│update│send│schedule│     forward     │sample│...
               time.perf_counter() ───────────────────────────────────────────────────────────────►

A `Timeline` collects `Span`s: on which lane (a process or a thread) some work ran, what it was, and
from when to when, on `time.perf_counter()` — one clock for every process of one machine, so the
core's spans and the front end's line up. Recording is off unless a timeline is given:

    AsyncLLM(config=..., timeline=Timeline("server"))              # the engine in the server's process
    ProcessAsyncLLM(config=..., timeline=Timeline("front end"))     # the core records its own spans and
                                                                    # ships them back in its CoreSteps

Off, a hook costs one `is None` test (`span(None, ...)` is a shared do-nothing context) and no method
is wrapped. `instrument(engine, timeline)` times one engine object's phases from outside, without
changing the engine's code: it wraps the scheduler's `schedule`, the runner's `execute` (the
forward pass) and its sampler, and the engine's per-token output step (detokenizing and stop
strings, when this engine detokenizes) — on that object only.

Spans nest (a step contains a forward pass, which contains the sampling); `flatten` turns them into
the pieces a picture draws: on each lane, every moment belongs to the innermost span open then. A
`Recording` keeps one run's pieces (in ms from its start) as plain data, and says what share of the run
each kind of work took and how long two kinds of work ran at the same time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# What a span can be, in the order a legend lists them, and whose work it is.
FRONT_END_KINDS = ("tokenize", "receive", "detokenize", "send to client")
CORE_KINDS = ("schedule", "forward", "sample", "update", "send")
KINDS = FRONT_END_KINDS + CORE_KINDS
WORKER = " (worker thread)"  # a lane's worker threads (tokenizing off the event loop) get a lane of their own


class Span(NamedTuple):
    lane: str  # where it ran: "server", "front end", "core", "front end (worker thread)"...
    kind: str  # one of KINDS
    start: float  # time.perf_counter()
    end: float


class Timeline:
    """Spans recorded on `lane` (and on its worker threads' lane), in the order they ended."""

    def __init__(self, lane: str):
        self.lane = lane
        self.spans: list[Span] = []
        self._lock = threading.Lock()  # worker threads add spans too

    def add(self, kind: str, start: float, end: float, lane: str | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"a span's kind must be one of {KINDS}, got {kind!r}")
        with self._lock:
            self.spans.append(Span(lane or self.lane, kind, start, end))

    @contextlib.contextmanager
    def span(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(kind, start, time.perf_counter())

    def call(self, kind: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args)` recorded as a `kind` span on this lane's worker-thread lane (call it from a worker)."""
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.add(kind, start, time.perf_counter(), self.lane + WORKER)

    def extend(self, spans: Iterable[Span | tuple]) -> None:
        """Spans recorded elsewhere (the core's, shipped in a CoreStep)."""
        with self._lock:
            self.spans.extend(Span(*s) for s in spans)

    def drain(self) -> list[Span]:
        """The spans recorded so far, handed over and forgotten here."""
        with self._lock:
            spans, self.spans = self.spans, []
        return spans


_OFF = contextlib.nullcontext()


def span(timeline: Timeline | None, kind: str) -> contextlib.AbstractContextManager:
    """`with span(self.timeline, "receive"):` — a recorded span, or nothing at all when the timeline is off."""
    return _OFF if timeline is None else timeline.span(kind)


def instrument(engine: Any, timeline: Timeline) -> Callable[[], None]:
    """Record `engine`'s phases on `timeline`: each step ("update": what is left of it once the parts below
    are cut out), its scheduling, its forward pass, its sampling, and — when this engine detokenizes — its
    per-token output step ("detokenize": text and stop strings). Only this engine object is touched, and
    only where it has those parts (an engine without one simply records less). Returns the undo."""
    targets = [(engine, "step", "update"), (engine.scheduler, "schedule", "schedule"),
               (engine.runner, "execute", "forward"), (engine.runner, "_sample", "sample")]
    if getattr(engine, "detokenize", False):
        targets.append((engine, "_emit", "detokenize"))
    wrapped = []
    for owner, name, kind in targets:
        method = getattr(owner, name, None)
        if method is None:
            continue
        setattr(owner, name, _timed(timeline, kind, method))
        wrapped.append((owner, name))

    def undo() -> None:
        for owner, name in wrapped:
            owner.__dict__.pop(name, None)  # the class's own method shows through again

    return undo


def _timed(timeline: Timeline, kind: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            timeline.add(kind, start, time.perf_counter())

    return timed


def flatten(spans: Iterable[Span]) -> list[Span]:
    """Nested spans as the pieces a picture draws: on each lane, every moment belongs to the innermost span
    open then (the one that started last). Pieces come out sorted by lane, then time; none overlap on a lane."""
    pieces: list[Span] = []
    by_lane: dict[str, list[Span]] = {}
    for s in spans:
        if s.end > s.start:
            by_lane.setdefault(s.lane, []).append(s)
    for lane in sorted(by_lane):
        lane_spans = sorted(by_lane[lane], key=lambda s: (s.start, -s.end))  # an outer span before its inner ones
        edges = sorted({t for s in lane_spans for t in (s.start, s.end)})
        open_: list[Span] = []  # spans covering the current moment, outermost first
        i = 0
        for left, right in zip(edges, edges[1:]):
            open_ = [s for s in open_ if s.end > left]
            while i < len(lane_spans) and lane_spans[i].start <= left:
                if lane_spans[i].end > left:
                    open_.append(lane_spans[i])
                i += 1
            if open_:
                inner = max(open_, key=lambda s: (s.start, -s.end))
                last = pieces[-1] if pieces else None
                if last is not None and last.lane == lane and last.kind == inner.kind and last.end == left:
                    pieces[-1] = last._replace(end=right)  # one piece for one kind of work, unbroken
                else:
                    pieces.append(Span(lane, inner.kind, left, right))
    return pieces


@dataclass
class Recording:
    """One recorded run as a picture needs it: its pieces of work (flattened) in ms from its start."""

    label: str  # what ran, in words
    lanes: list[str]  # in the order to draw them
    spans: list[Span]  # flattened, times in ms from the run's start
    wall_ms: float  # the run, from the first request sent to the last answer's last piece sent
    tokens: int  # tokens the run's requests generated
    info: dict[str, Any] = field(default_factory=dict)  # how it was run (requests, slots, machine...)

    @classmethod
    def of(cls, label: str, spans: Iterable[Span], start: float, end: float, tokens: int,
           lane_order: Sequence[str] = ("server", "front end", "core"), **info: Any) -> Recording:
        """The spans recorded between `start` and `end` (perf_counter seconds), cut to that window and flattened."""
        pieces = [s for s in flatten(spans) if s.end > start and s.start < end]

        def order(lane: str) -> tuple[int, str]:
            base = lane.removesuffix(WORKER)
            return (lane_order.index(base) if base in lane_order else len(lane_order), lane)

        lanes = sorted({s.lane for s in pieces}, key=order)
        ms = [Span(s.lane, s.kind, (max(s.start, start) - start) * 1e3, (min(s.end, end) - start) * 1e3)
              for s in pieces]
        return cls(label, lanes, ms, (end - start) * 1e3, tokens, dict(info))

    def busy_ms(self, kinds: Iterable[str] = KINDS, lane: str | None = None) -> float:
        """Time spent on work of `kinds` (on `lane`, or on every lane added up)."""
        kinds = set(kinds)
        return sum(s.end - s.start for s in self.spans if s.kind in kinds and (lane is None or s.lane == lane))

    def share(self) -> dict[str, float]:
        """Each kind of work's time as a share of the run's wall time (a kind on several lanes: added up)."""
        return {kind: self.busy_ms([kind]) / self.wall_ms for kind in KINDS if self.busy_ms([kind]) > 0}

    def overlap_ms(self, kinds_a: Iterable[str], kinds_b: Iterable[str]) -> float:
        """How long work of `kinds_a` and work of `kinds_b` ran at the same time (necessarily on different lanes)."""
        a, b = self._union(kinds_a), self._union(kinds_b)
        total, j = 0.0, 0
        for start, end in a:
            while j < len(b) and b[j][1] <= start:
                j += 1
            k = j
            while k < len(b) and b[k][0] < end:
                total += min(end, b[k][1]) - max(start, b[k][0])
                k += 1
        return total

    def _union(self, kinds: Iterable[str]) -> list[tuple[float, float]]:
        kinds = set(kinds)
        merged: list[tuple[float, float]] = []
        for start, end in sorted((s.start, s.end) for s in self.spans if s.kind in kinds):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def to_dict(self) -> dict:
        """Plain JSON: each piece as [lane index, kind, start ms, end ms], rounded to 0.1 µs."""
        return {"label": self.label, "lanes": self.lanes, "wall_ms": round(self.wall_ms, 4), "tokens": self.tokens,
                "info": self.info, "spans": [[self.lanes.index(s.lane), s.kind, round(s.start, 4), round(s.end, 4)]
                                             for s in self.spans]}

    @classmethod
    def from_dict(cls, data: dict) -> Recording:
        lanes = list(data["lanes"])
        return cls(data["label"], lanes, [Span(lanes[i], kind, start, end) for i, kind, start, end in data["spans"]],
                   data["wall_ms"], data["tokens"], dict(data.get("info", {})))
