"""Rank lanes: a real multi-process run replayed as one lane per process (chapter 13).

    rank 0 (engine) ▕ compute ▏ar▏ compute ▏ar▏ ... ▏gather▏  (schedule, sample)  ▕ compute ▏ar▏ ...
    rank 1          ▕ compute ▏ar▏ compute ▏ar▏ ... ▏gather▏       idle           ▕ compute ▏ar▏ ...
                                 └ an all-reduce ends for everyone when the last rank arrives

    prefill worker  ▕ prefill ▏send KV▏        ▕ prefill ▏send KV▏
    decode worker   ▕decode▏decode▏  ╲receive KV▏decode▏decode▏decode▏  ╲ ...   (an arrow per transfer)

Tensor parallelism's lanes come from the ranks' own records (`minillm/distributed/communicator.py::
Collective`: each step's span and every collective inside it, on `time.perf_counter()`, one clock for all
the processes of a machine): a step's time outside its collectives is compute, time outside any step is
idle. A disaggregated pair's lanes come from its two engine cores' spans (`minillm/disagg/router.py`), with
an arrow for each prompt whose K/V blocks travelled. `render_frame` is a pure function returning an SVG
string; the widget precomputes a window sliding over the run and plays it in the browser.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from widgets.animation import Animation

PLOT_W, LEFT, LANE_H, GAP = 720, 120, 20, 30
COLOURS = {"compute": "#4c78a8", "all-reduce": "#e45756", "gather": "#f58518", "prefill": "#54a24b",
           "decode": "#4c78a8", "send KV": "#b279a2", "receive KV": "#b279a2"}
ORDER = ("compute", "prefill", "decode", "all-reduce", "gather", "send KV", "receive KV", "idle")


@dataclass(frozen=True)
class LaneSpan:
    kind: str  # one of COLOURS
    start: float  # seconds, any origin (the widget subtracts the earliest)
    end: float
    label: str = ""


@dataclass
class Lane:
    name: str
    spans: list[LaneSpan] = field(default_factory=list)


@dataclass(frozen=True)
class Transfer:
    """Bytes leaving lane `source` at `start` and arriving at lane `target` at `end` (an arrow)."""

    source: str
    target: str
    start: float
    end: float
    label: str


def lanes_from_collectives(records: Mapping[int, Iterable]) -> list[Lane]:
    """Tensor parallelism's lanes: per rank (rank order), its collectives as spans and the rest of each step
    as compute pieces between them."""
    lanes = []
    for rank in sorted(records):
        items = sorted(records[rank], key=lambda c: c.start)
        collectives = [c for c in items if c.kind != "step"]
        spans = [LaneSpan(c.kind, c.start, c.end, f"{c.nbytes / 1024:.1f} KiB") for c in collectives]
        for step in (c for c in items if c.kind == "step"):
            cursor = step.start
            for c in collectives:
                if c.end <= step.start or c.start >= step.end:
                    continue
                if c.start > cursor:
                    spans.append(LaneSpan("compute", cursor, c.start))
                cursor = max(cursor, c.end)
            if step.end > cursor:
                spans.append(LaneSpan("compute", cursor, step.end))
        lanes.append(Lane("rank 0 (engine)" if rank == 0 else f"rank {rank}", sorted(spans, key=lambda s: s.start)))
    return lanes


def _extent(lanes: Sequence[Lane], transfers: Sequence[Transfer] = ()) -> tuple[float, float]:
    starts = [s.start for lane in lanes for s in lane.spans] + [t.start for t in transfers]
    ends = [s.end for lane in lanes for s in lane.spans] + [t.end for t in transfers]
    return (min(starts), max(ends)) if starts else (0.0, 0.0)


def _busy(spans: Iterable[LaneSpan], lo: float, hi: float) -> dict[str, float]:
    """Seconds of each kind inside [lo, hi], and "idle" for the rest (overlapping spans of a lane counted once,
    by the first in ORDER)."""
    cuts = sorted({lo, hi, *(min(max(t, lo), hi) for s in spans for t in (s.start, s.end))})
    spans = list(spans)
    out: dict[str, float] = {}
    for a, b in zip(cuts, cuts[1:]):
        kinds = [s.kind for s in spans if s.start <= a and s.end >= b]
        kind = min(kinds, key=ORDER.index) if kinds else "idle"
        out[kind] = out.get(kind, 0.0) + (b - a)
    return out


def shares(lanes: Sequence[Lane]) -> dict[str, dict[str, float]]:
    """Per lane, the share of the whole run (every lane's first span to the last one's end) in each kind."""
    lo, hi = _extent(lanes)
    total = hi - lo
    if total <= 0:
        return {lane.name: {} for lane in lanes}
    return {lane.name: {k: v / total for k, v in _busy(lane.spans, lo, hi).items()} for lane in lanes}


def render_frame(lanes: Sequence[Lane], transfers: Sequence[Transfer], t_end: float, window: float,
                 step: int = 0) -> str:
    """SVG of every lane from `t_end - window` to `t_end` (seconds from the run's start), a legend, a time axis
    in ms and, per lane, the window's shares."""
    head = ('<svg xmlns="http://www.w3.org/2000/svg" class="rank-lanes" width="{w}" height="{h}" '
            'viewBox="0 0 {w} {h}" style="max-width:100%;height:auto" data-step="{step}" font-family="sans-serif" '
            'font-size="11">')
    if not any(lane.spans for lane in lanes):
        return head.format(w=LEFT + PLOT_W, h=30, step=step) + '<text x="0" y="18">nothing recorded</text></svg>'
    origin, _ = _extent(lanes, transfers)
    lo, hi = t_end - window, t_end
    x = lambda t: LEFT + PLOT_W * (t - origin - lo) / window  # noqa: E731
    parts = [f'<text x="0" y="12" font-weight="bold">{lo * 1e3:.1f} – {hi * 1e3:.1f} ms of the run</text>']
    y, centre = 24.0, {}
    for lane in lanes:
        centre[lane.name] = y + LANE_H / 2
        parts.append(f'<text x="0" y="{y + 14}">{html.escape(lane.name)}</text>'
                     f'<rect x="{LEFT}" y="{y}" width="{PLOT_W}" height="{LANE_H}" fill="#f4f4f4"/>')
        for s in lane.spans:
            a, b = max(s.start - origin, lo), min(s.end - origin, hi)
            if b <= a:
                continue
            title = f"{s.kind}{': ' + s.label if s.label else ''} ({(s.end - s.start) * 1e3:.2f} ms)"
            parts.append(f'<rect x="{x(a + origin):.1f}" y="{y}" width="{max(PLOT_W * (b - a) / window, 0.6):.1f}" '
                         f'height="{LANE_H}" fill="{COLOURS.get(s.kind, "#999")}"><title>{html.escape(title)}'
                         '</title></rect>')
        busy = _busy([LaneSpan(s.kind, s.start - origin, s.end - origin) for s in lane.spans], lo, hi)
        words = " · ".join(f"{k} {busy[k] / window:.0%}" for k in ORDER if busy.get(k, 0) / window >= 0.005)
        parts.append(f'<text x="{LEFT}" y="{y + LANE_H + 12}" fill="#555">{html.escape(words)}</text>')
        y += LANE_H + GAP
    parts.append('<defs><marker id="rank-lanes-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                 'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>')
    for t in transfers:
        if t.source not in centre or t.target not in centre or t.end - origin < lo or t.start - origin > hi:
            continue
        x1, x2 = x(t.start), x(t.end)
        y1, y2 = centre[t.source], centre[t.target]
        parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#333" stroke-width="1.5" '
                     'marker-end="url(#rank-lanes-arrow)"/>'
                     f'<text x="{(x1 + x2) / 2 + 4:.1f}" y="{(y1 + y2) / 2:.1f}" fill="#333">{html.escape(t.label)}'
                     '</text>')
    tick_step = next(s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
                     if window * 1e3 / s <= 10)
    parts.append(f'<line x1="{LEFT}" y1="{y - 8}" x2="{LEFT + PLOT_W}" y2="{y - 8}" stroke="#999"/>')
    tick = math.ceil(max(lo, 0) * 1e3 / tick_step) * tick_step
    while tick <= hi * 1e3 + 1e-9:
        tx = LEFT + PLOT_W * (tick / 1e3 - lo) / window
        parts.append(f'<line x1="{tx:.1f}" y1="{y - 8}" x2="{tx:.1f}" y2="{y - 4}" stroke="#999"/>'
                     f'<text x="{tx:.1f}" y="{y + 6}" text-anchor="middle" fill="#555">{tick:g} ms</text>')
        tick += tick_step
    kinds = [k for k in ORDER[:-1] if any(s.kind == k for lane in lanes for s in lane.spans)]
    lx, ly = LEFT, y + 18
    for kind in kinds + ["idle"]:
        fill = COLOURS.get(kind, "#f4f4f4")
        parts.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{fill}" stroke="#ccc"/>'
                     f'<text x="{lx + 14}" y="{ly + 9}">{kind}</text>')
        lx += 30 + 6 * len(kind)
    width, height = LEFT + PLOT_W + 30, ly + 16
    return head.format(w=width, h=f"{height:.0f}", step=step) + "".join(parts) + "</svg>"


def frame_ends(total: float, window: float, max_frames: int) -> list[float]:
    """The window's right edge in each frame: from one window in to the run's end, evenly spaced."""
    if total <= window:
        return [window]
    count = max(2, min(max_frames, math.ceil(total / window) + 1))
    return [window + (total - window) * i / (count - 1) for i in range(count)]


class RankLanes(Animation):
    """The lanes on one clock, a window of `window` seconds (default: an eighth of the run, at least one step's
    worth) sliding over them in up to `max_frames` frames."""

    def __init__(self, lanes: Sequence[Lane], transfers: Sequence[Transfer] = (), window: float | None = None,
                 max_frames: int = 40, interval_ms: int = 300):
        lo, hi = _extent(lanes, transfers)
        total = hi - lo
        window = window or max(total / 8, 1e-3)
        ends = frame_ends(total, window, max_frames) if total > 0 else [window]
        labels = [f"{max(t - window, 0) * 1e3:.1f} – {t * 1e3:.1f} ms" for t in ends]
        frames = [render_frame(lanes, transfers, t, window, step=i) for i, t in enumerate(ends)]
        super().__init__([frames], labels, still=len(frames) // 2, interval_ms=interval_ms, start=0)
