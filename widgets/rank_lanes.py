"""Rank lanes: a real multi-process run replayed as one lane per process, time across (chapter 13).

    rank 0 (engine) ▕ compute ▏ar▏ compute ▏ar▏ ... ▏gather▏  (schedule, sample)  ▕ compute ▏ar▏ ...
                     compute 61% · all-reduce 27% · gather 3% · idle 9%
    rank 1          ▕ compute ▏ar▏ compute ▏ar▏ ... ▏gather▏       idle           ▕ compute ▏ar▏ ...
                                 └ an all-reduce ends for everyone when the last rank arrives

    prefill worker  ▕ prefill ▏send KV▏            ▕ prefill ▏send KV▏
                                ╲ req 3: 12 blocks, 96 KiB
    decode worker   ▕decode▏decode▏╲receive KV▏decode▏decode▏  ...      (an arrow per transfer)

Tensor parallelism's lanes come from the ranks' own records (`minillm/distributed/communicator.py::
Collective`: each step's span and every collective inside it, on `time.perf_counter()`, one clock for all
the processes of a machine): a step's time outside its collectives is compute, time outside any step is
idle. A disaggregated pair's lanes come from its two engine cores' spans (`minillm/disagg/router.py`), with
an arrow for each prompt whose K/V blocks travelled, from the sender's lane to the receiver's.

`render_frame(lanes, transfers, t_end, window)` is a pure function returning the SVG of the window
[t_end - window, t_end] (seconds from the run's earliest record); `RankLanes` precomputes a window sliding
over the run and plays it in the browser (`widgets/animation.py`). `shares(lanes)` is each lane's split of
the whole run, for a table.
"""

from __future__ import annotations

import heapq
import html
import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from widgets.animation import Animation

PLOT_W, LEFT, LANE_H = 720, 124, 20
WIDTH = LEFT + PLOT_W + 30  # room for the last tick's label
CHAR_W = 6.5  # an 11 px sans-serif character's width, at most on average: what labels are laid out with
SUMMARY_H, ROW_H, BAND_ROWS, LANE_GAP = 16, 13, 2, 6  # under a lane: its summary, then rows of transfer labels
COLOURS = {"compute": "#4c78a8", "all-reduce": "#e45756", "gather": "#f58518", "prefill": "#54a24b",
           "decode": "#72b7b2", "send KV": "#b279a2", "receive KV": "#d4a6c8"}
IDLE, OTHER = "#f4f4f4", "#9d9da0"  # the lane's background; a kind this module has no colour for
ORDER = ("compute", "prefill", "decode", "all-reduce", "gather", "send KV", "receive KV")
WORDS = {"all-reduce": "all-reduce (sum over ranks)", "gather": "gather (logits to rank 0)"}


@dataclass(frozen=True)
class LaneSpan:
    """A piece of one lane's time: `kind` (a key of COLOURS, or any other word), seconds on any origin."""

    kind: str
    start: float
    end: float
    label: str = ""  # shown on hover


@dataclass
class Lane:
    name: str
    spans: list[LaneSpan] = field(default_factory=list)


@dataclass(frozen=True)
class Transfer:
    """Bytes leaving lane `source` at `start` and arriving at lane `target` at `end`: an arrow between them."""

    source: str
    target: str
    start: float
    end: float
    label: str


# ------------------------------------------------------------------------------------------------ intervals
def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _subtract(keep: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of `keep` outside `cut` (both sorted and disjoint), in one pass."""
    out, j = [], 0
    for a, b in keep:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        k, cursor = j, a
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > cursor:
                out.append((cursor, cut[k][0]))
            cursor = max(cursor, cut[k][1])
            k += 1
        if cursor < b:
            out.append((cursor, b))
    return out


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def lanes_from_collectives(records: Mapping[int, Iterable]) -> list[Lane]:
    """Tensor parallelism's lanes, in rank order, from each rank's `Collective` records (rank -> records, as
    `TensorParallelWorkers.drain()` returns them, in any order): every collective as a span of its kind, and
    the time inside a "step" span not covered by a collective as compute. The rest is idle (no span)."""
    lanes = []
    for rank in sorted(records):
        items = list(records[rank])
        steps = _union((c.start, c.end) for c in items if c.kind == "step")
        talks = [c for c in items if c.kind != "step"]
        spans = [LaneSpan(c.kind, c.start, c.end, f"{_size(c.nbytes)} sent by this rank") for c in talks]
        spans += [LaneSpan("compute", a, b) for a, b in _subtract(steps, _union((c.start, c.end) for c in talks))]
        spans.sort(key=lambda s: (s.start, s.end))
        lanes.append(Lane("rank 0 (engine)" if rank == 0 else f"rank {rank}", spans))
    return lanes


def _pieces(spans: Iterable[LaneSpan]) -> list[tuple[float, float, str]]:
    """One lane's time as disjoint pieces, in order: where spans overlap, the one that began last (the inner
    one when spans nest) owns the time. Idle time (no span, or a span of kind "idle") is not a piece."""
    spans = sorted((s for s in spans if s.end > s.start and s.kind != "idle"), key=lambda s: (s.start, -s.end))
    times = sorted({t for s in spans for t in (s.start, s.end)})
    out: list[tuple[float, float, str]] = []
    active: list[tuple[float, float, int, str]] = []  # (-start, -end, order, kind): the latest start on top
    i = 0
    for a, b in zip(times, times[1:]):
        while i < len(spans) and spans[i].start <= a:
            heapq.heappush(active, (-spans[i].start, -spans[i].end, i, spans[i].kind))
            i += 1
        while active and -active[0][1] <= a:
            heapq.heappop(active)
        if not active:
            continue
        kind = active[0][3]
        if out and out[-1][2] == kind and out[-1][1] == a:
            out[-1] = (out[-1][0], b, kind)
        else:
            out.append((a, b, kind))
    return out


def _ordered(seconds: Mapping[str, float]) -> list[str]:
    """Kinds in the legend's order: the known ones, then others alphabetically, idle last."""
    known = [k for k in ORDER if k in seconds]
    return known + sorted(k for k in seconds if k not in ORDER and k != "idle") + (["idle"] if "idle" in seconds
                                                                                    else [])


def _busy(pieces: list[tuple[float, float, str]], ends: list[float], lo: float, hi: float) -> dict[str, float]:
    """Seconds of each kind inside [lo, hi], and "idle" for the rest (`ends`: the pieces' ends, for bisecting)."""
    out: dict[str, float] = {}
    for a, b, kind in pieces[bisect_right(ends, lo):]:
        if a >= hi:
            break
        out[kind] = out.get(kind, 0.0) + min(b, hi) - max(a, lo)
    idle = (hi - lo) - sum(out.values())
    if idle > 1e-12 * max(hi - lo, 1.0):
        out["idle"] = idle
    return {k: out[k] for k in _ordered(out)}


def _extent(lanes: Sequence[Lane], transfers: Sequence[Transfer] = ()) -> tuple[float, float]:
    starts = [s.start for lane in lanes for s in lane.spans] + [t.start for t in transfers]
    ends = [s.end for lane in lanes for s in lane.spans] + [t.end for t in transfers]
    starts += [t.end for t in transfers]  # a transfer drawn backwards in time still lies inside the run
    ends += [t.start for t in transfers]
    return (min(starts), max(ends)) if starts else (0.0, 0.0)


def shares(lanes: Sequence[Lane]) -> dict[str, dict[str, float]]:
    """Per lane, the fraction of the whole run (the earliest span's start to the latest end, over all lanes)
    in each kind, "idle" for time in none; the fractions of a lane sum to 1. Empty dicts when nothing ran."""
    lo, hi = _extent(lanes)
    if hi <= lo:
        return {lane.name: {} for lane in lanes}
    out = {}
    for lane in lanes:
        pieces = _pieces(lane.spans)
        busy = _busy(pieces, [p[1] for p in pieces], lo, hi)
        out[lane.name] = {kind: seconds / (hi - lo) for kind, seconds in busy.items()}
    return out


# ------------------------------------------------------------------------------------------------ drawing
def _text(x: float, y: float, words: str, anchor: str = "start", fill: str = "#222", extra: str = "") -> str:
    """A label with a white halo, so an arrow passing under it leaves it readable."""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}" stroke="#fff" stroke-width="3" '
            f'paint-order="stroke"{extra}>{html.escape(words)}</text>')


def _fit(words: str, width: float) -> str:
    most = max(int(width / CHAR_W), 2)
    return words if len(words) <= most else words[:most - 1] + "…"


def _summary(busy: Mapping[str, float], window: float) -> str:
    parts, room = [], PLOT_W / CHAR_W
    for kind, seconds in busy.items():
        if seconds / window < 0.005:
            continue
        part = f"{kind} {seconds / window:.0%}"
        if len(" · ".join(parts + [part])) > room - 2:
            parts.append("…")
            break
        parts.append(part)
    return " · ".join(parts)


def _ticks(lo: float, hi: float, window: float, y: float) -> list[str]:
    step = next((s for s in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000,
                             5000, 10000, 20000, 50000) if window * 1e3 / s <= 10), None)
    if step is None:
        step = 10 ** math.ceil(math.log10(window * 1e3 / 10))
    parts = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}" stroke="#999"/>']
    k = math.ceil(max(lo, 0.0) * 1e3 / step - 1e-9)
    while k * step <= hi * 1e3 + 1e-9:
        ms = k * step
        x = LEFT + PLOT_W * (ms / 1e3 - lo) / window
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#999"/>'
                     + _text(x, y + 15, f"{round(ms, 6):g} ms", "middle", "#555"))
        k += 1
    return parts


def _legend(kinds: list[str], y: float) -> tuple[list[str], float]:
    parts, x = [], LEFT
    for kind in kinds + ["idle"]:
        words = WORDS.get(kind, kind)
        width = 14 + CHAR_W * len(words) + 12
        if x + width > WIDTH and x > LEFT:
            x, y = LEFT, y + 16
        fill = IDLE if kind == "idle" else COLOURS.get(kind, OTHER)
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="10" height="10" fill="{fill}" stroke="#ccc"/>'
                     + _text(x + 14, y + 9, words))
        x += width
    return parts, y + 16


def render_frame(lanes: Sequence[Lane], transfers: Sequence[Transfer], t_end: float, window: float,
                 step: int = 0) -> str:
    """SVG of every lane from `t_end - window` to `t_end` (seconds from the run's earliest record): the spans
    coloured by kind, an arrow per transfer, per lane the window's share of each kind, a time axis in ms and a
    legend of the kinds in the run. `step` is the frame's index, the root's data-step."""
    if window <= 0:
        raise ValueError(f"the window must be longer than 0 s, got {window}")
    names = [lane.name for lane in lanes]
    for t in transfers:
        if t.source not in names or t.target not in names or t.source == t.target:
            raise ValueError(f"a transfer goes between two of the lanes {names}, got {t.source!r} -> {t.target!r}")
    head = ('<svg xmlns="http://www.w3.org/2000/svg" class="rank-lanes" width="{w}" height="{h}" '
            'viewBox="0 0 {w} {h}" style="max-width:100%;height:auto" data-step="{step}" font-family="sans-serif" '
            'font-size="11">')
    if not any(lane.spans for lane in lanes):
        who = ", ".join(names) if names else "no lanes"
        return (head.format(w=WIDTH, h=40, step=step)
                + _text(0, 16, "nothing recorded: no span in any lane, so there is no run to replay", fill="#c00")
                + _text(0, 32, _fit(f"({who})", WIDTH), fill="#555") + "</svg>")

    origin, last = _extent(lanes, transfers)
    lo, hi = t_end - window, t_end
    x_of = lambda t: LEFT + PLOT_W * (t - origin - lo) / window  # noqa: E731  (t: a recorded time)
    band = BAND_ROWS * ROW_H if transfers else 0
    tops = [30.0 + i * (LANE_H + SUMMARY_H + band + LANE_GAP) for i in range(len(lanes))]
    title = f"{max(lo, 0) * 1e3:.1f} – {hi * 1e3:.1f} ms of a {(last - origin) * 1e3:.1f} ms run"
    title += " · arrows: transfers from one lane to another" if transfers else ""
    parts = [_text(0, 12, title, extra=' font-weight="bold"')]
    for lane, y in zip(lanes, tops):
        parts.append(f'<g><title>{html.escape(lane.name)}</title>'
                     + _text(LEFT - 6, y + 14, _fit(lane.name, LEFT - 8), "end") + '</g>'
                     f'<rect x="{LEFT}" y="{y}" width="{PLOT_W}" height="{LANE_H}" fill="{IDLE}"/>')
        for s in sorted(lane.spans, key=lambda s: (s.start, -s.end)):  # an outer span first, an inner one on it
            a, b = max(s.start - origin, lo), min(s.end - origin, hi)
            if b <= a or s.kind == "idle":  # idle is the lane's background
                continue
            title = f"{WORDS.get(s.kind, s.kind)}{': ' + s.label if s.label else ''} ({(s.end - s.start) * 1e3:.3f} ms)"
            parts.append(f'<rect x="{x_of(a + origin):.1f}" y="{y}" width="{max(PLOT_W * (b - a) / window, 0.6):.1f}" '
                         f'height="{LANE_H}" fill="{COLOURS.get(s.kind, OTHER)}"><title>{html.escape(title)}</title>'
                         '</rect>')
        pieces = [(a - origin, b - origin, kind) for a, b, kind in _pieces(lane.spans)]
        summary = _summary(_busy(pieces, [p[1] for p in pieces], lo, hi), window)
        parts.append(_text(LEFT, y + LANE_H + 12, summary, fill="#444"))

    rows: dict[tuple[int, int], list[tuple[float, float]]] = {}  # (band, row) -> the labels' extents there
    for t in sorted(transfers, key=lambda t: (t.start, t.end)):
        parts += _arrow(t, names, tops, rows, x_of, origin + lo, origin + hi)

    y = tops[-1] + LANE_H + SUMMARY_H + 4  # (no arrow's label goes under the last lane)
    parts += _ticks(lo, hi, window, y)
    seen = {s.kind for lane in lanes for s in lane.spans}
    legend, y = _legend([k for k in _ordered(dict.fromkeys(seen, 0.0)) if k != "idle"], y + 26)
    return head.format(w=WIDTH, h=f"{y + 2:.0f}", step=step) + "".join(parts + legend) + "</svg>"


def _arrow(t: Transfer, names: list[str], tops: list[float], rows: dict, x_of, lo: float, hi: float) -> list[str]:
    """One transfer's arrow, cut to the window (its head only if its end is inside), and its label in the band
    of label rows it crosses next to the receiver, in the first row where it meets no other label."""
    i, j = names.index(t.source), names.index(t.target)
    down = i < j
    y1 = tops[i] + LANE_H if down else tops[i]
    y2 = tops[j] if down else tops[j] + LANE_H
    t0, t1 = t.start, t.end
    u0, u1 = 0.0, 1.0  # the part of the arrow inside [lo, hi], as fractions of its length
    if t1 != t0:
        ua, ub = (lo - t0) / (t1 - t0), (hi - t0) / (t1 - t0)
        u0, u1 = max(u0, min(ua, ub)), min(u1, max(ua, ub))
    elif not lo <= t0 <= hi:
        return []
    if u1 < u0 or (u1 == u0 and t1 != t0):
        return []
    at = lambda u: (x_of(t0 + u * (t1 - t0)), y1 + u * (y2 - y1))  # noqa: E731
    (xa, ya), (xb, yb) = at(u0), at(u1)
    title = f"<title>{html.escape(t.label)} ({(t1 - t0) * 1e3:.3f} ms)</title>"
    parts = [f'<g class="transfer">{title}<line x1="{xa:.1f}" y1="{ya:.1f}" x2="{xb:.1f}" y2="{yb:.1f}" '
             'stroke="#333" stroke-width="1.5"/>']
    if u1 == 1.0:  # the head, drawn (not a marker: a marker's id repeats in every frame of the page)
        length = math.hypot(xb - xa, yb - ya) or 1.0
        dx, dy = (xb - xa) / length, (yb - ya) / length
        if length < 1.0:
            dx, dy = 0.0, (1.0 if down else -1.0)
        left = (xb - 7 * dx - 3.5 * dy, yb - 7 * dy + 3.5 * dx)
        right = (xb - 7 * dx + 3.5 * dy, yb - 7 * dy - 3.5 * dx)
        parts.append(f'<polygon class="arrow-head" points="{xb:.1f},{yb:.1f} {left[0]:.1f},{left[1]:.1f} '
                     f'{right[0]:.1f},{right[1]:.1f}" fill="#333"/>')
    parts.append("</g>")
    band = j - 1 if down else j  # the label band under lane `band`, which this arrow crosses
    band_top = tops[band] + LANE_H + SUMMARY_H
    width = CHAR_W * len(t.label)
    for row in range(BAND_ROWS):
        base = band_top + (row + 1) * ROW_H - 3
        u = (base - 4 - y1) / (y2 - y1)
        x = min(max(x_of(t0 + u * (t1 - t0)), LEFT), LEFT + PLOT_W)
        a, anchor = (x + 4, "start") if x + 4 + width <= WIDTH - 2 else (x - 4 - width, "end")
        taken = rows.setdefault((band, row), [])
        if a < 0 or any(a < b2 + 6 and a2 < a + width + 6 for a2, b2 in taken):
            continue
        taken.append((a, a + width))
        parts.append(_text(x + 4 if anchor == "start" else x - 4, base, t.label, anchor, "#333"))
        break
    return parts  # no free row: the label is the arrow's hover title only


# ------------------------------------------------------------------------------------------------ the widget
def frame_ends(total: float, window: float, max_frames: int) -> list[float]:
    """The window's right edge in each frame: from one window in to the run's end, evenly spaced."""
    if total <= window:
        return [window]
    count = max(2, min(max_frames, math.ceil(total / window) + 1))
    return [window + (total - window) * i / (count - 1) for i in range(count)]


def frame_labels(ends: Sequence[float], window: float) -> list[str]:
    """The slider's words for each frame, with as many decimals as it takes to keep them distinct."""
    for decimals in range(1, 7):
        labels = [f"{max(t - window, 0) * 1e3:.{decimals}f} – {t * 1e3:.{decimals}f} ms" for t in ends]
        if len(set(labels)) == len(labels):
            return labels
    return [f"frame {i + 1}: {label}" for i, label in enumerate(labels)]


class RankLanes(Animation):
    """The lanes on one clock, a window of `window` seconds (default: an eighth of the run) sliding over them in
    up to `max_frames` frames; it opens at the start (▶ plays the whole run), and its still picture shows the
    middle. A run that recorded nothing is one frame saying so."""

    def __init__(self, lanes: Sequence[Lane], transfers: Sequence[Transfer] = (), window: float | None = None,
                 max_frames: int = 40, interval_ms: int = 300):
        lanes, transfers = list(lanes), list(transfers)
        lo, hi = _extent(lanes, transfers)
        total = hi - lo
        if window is None:
            window = total / 8 if total > 0 else 1e-3
        if window <= 0:
            raise ValueError(f"the window must be longer than 0 s, got {window}")
        if total > 0:
            window = min(window, total)  # one frame of the whole run, not a run lost in empty space
        ends = frame_ends(total, window, max_frames)
        frames = [render_frame(lanes, transfers, t, window, step=i) for i, t in enumerate(ends)]
        super().__init__([frames], frame_labels(ends, window), still=len(frames) // 2, interval_ms=interval_ms,
                         start=0)
