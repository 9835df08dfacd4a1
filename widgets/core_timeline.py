"""Core timeline: a real run replayed span by span, one lane per process or thread, before and after the
engine core moved to a process of its own (`minillm/engine_core/timeline.py` records them).

    before   server   ▕sched▏ forward ▕smp▏upd▏detok▏send▏sched▏ forward ▕smp▏...   one interpreter:
                                                                                   the model waits
    after    front end          ▕detok▏send▏            ▕detok▏send▏                while the front end
             core     ▕sched▏ forward ▕smp▏upd▏snd▏sched▏ forward ▕smp▏...          works beside it
                      └──────── a window of the run, sliding as it plays ────────┘

Each recording gets an overview of its whole run (one thin bar per lane, the window outlined) and, below
it, the window drawn large: every piece of work as long as it took, coloured by what it was — warm
colours the front end's work, cool ones the core's. Both recordings share one clock, so the one that
finished first ends first. `render_frame(recordings, t_ms, window_ms)` is a pure function returning an
SVG string; the widget precomputes the frames and plays them in the browser (`widgets/animation.py`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from minillm.timeline import CORE_KINDS, FRONT_END_KINDS, WORKER, Recording
from widgets.animation import Animation

PLOT_W, LEFT, LANE_H, THIN_H, OVERVIEW_H, BINS = 720, 130, 22, 10, 5, 240
COLOURS = {  # warm: the front end's work; cool: the core's
    "tokenize": "#e45756", "receive": "#ff9da6", "detokenize": "#f58518", "send to client": "#eeca3b",
    "schedule": "#72b7b2", "forward": "#4c78a8", "sample": "#54a24b", "update": "#9d9da0", "send": "#b279a2",
}
WORDS = {"detokenize": "detokenize + stop strings", "send to client": "SSE line to the client",
         "update": "step bookkeeping", "send": "send to front end"}


def frame_times(wall_ms: float, window_ms: float, max_frames: int) -> list[float]:
    """The window's right edge in each frame: from one window in to the run's end, evenly spaced."""
    if wall_ms <= window_ms:
        return [window_ms]
    count = max(2, min(max_frames, math.ceil(wall_ms / window_ms) + 1))
    return [window_ms + (wall_ms - window_ms) * i / (count - 1) for i in range(count)]


def _overview(rec: Recording, lane: str) -> list[tuple[int, int, str]]:
    """The lane's whole run in BINS bins: each bin coloured by the kind of work that filled most of it
    (none if it was mostly idle), consecutive bins of one kind merged — a handful of rectangles."""
    width = rec.wall_ms / BINS
    fill = [dict() for _ in range(BINS)]
    for s in rec.spans:
        if s.lane != lane:
            continue
        first, last = int(s.start / width), min(int(s.end / width), BINS - 1)
        for b in range(first, last + 1):
            part = min(s.end, (b + 1) * width) - max(s.start, b * width)
            if part > 0:
                fill[b][s.kind] = fill[b].get(s.kind, 0.0) + part
    runs: list[tuple[int, int, str]] = []
    for b, kinds in enumerate(fill):
        if not kinds or sum(kinds.values()) < width / 2:
            continue
        kind = max(kinds, key=kinds.get)
        if runs and runs[-1][2] == kind and runs[-1][1] == b:
            runs[-1] = (runs[-1][0], b + 1, kind)
        else:
            runs.append((b, b + 1, kind))
    return runs


def lane_words(lane: str) -> str:
    return "worker thread" if lane.endswith(WORKER) else lane


def stats(rec: Recording) -> str:
    """One line: tokens, time, the forward's share, and how much of the front end's work overlapped it."""
    forward = rec.busy_ms(["forward"]) / rec.wall_ms
    front = rec.busy_ms(FRONT_END_KINDS)
    beside = rec.overlap_ms(FRONT_END_KINDS, ["forward"])
    return (f"{rec.tokens} tokens in {rec.wall_ms:.0f} ms ({rec.tokens / rec.wall_ms * 1e3:,.0f} tok/s) · forward "
            f"{forward:.0%} of the run · front-end work {front:.1f} ms, {beside / front if front else 0:.0%} of it "
            "beside a forward")


def _panel(rec: Recording, y: float, t_ms: float, window_ms: float, span_ms: float) -> tuple[list[str], float]:
    parts = [f'<text x="0" y="{y + 12}" font-weight="bold">{html.escape(rec.label)}</text>',
             f'<text x="0" y="{y + 27}" fill="#333">{html.escape(stats(rec))}</text>']
    y += 36
    x_all = lambda t: LEFT + PLOT_W * t / span_ms  # noqa: E731  (the whole run, on the shared clock)
    scale = rec.wall_ms / BINS
    for lane in rec.lanes:  # the overview: one thin bar per lane
        parts.append(f'<rect x="{LEFT}" y="{y}" width="{x_all(rec.wall_ms) - LEFT:.1f}" height="{OVERVIEW_H}" '
                     'fill="#f4f4f4"/>')
        for first, last, kind in _overview(rec, lane):
            x = x_all(first * scale)
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(x_all(last * scale) - x, 0.5):.1f}" '
                         f'height="{OVERVIEW_H}" fill="{COLOURS[kind]}"/>')
        y += OVERVIEW_H + 1
    top = y - len(rec.lanes) * (OVERVIEW_H + 1)
    left, right = x_all(max(t_ms - window_ms, 0)), x_all(t_ms)
    parts.append(f'<text x="{LEFT - 6}" y="{top + 8}" text-anchor="end" fill="#555">whole run</text>'
                 f'<rect x="{left:.1f}" y="{top - 2}" width="{right - left:.1f}" height="{y - top + 3}" fill="none" '
                 'stroke="#c00" stroke-width="1.2"/>')
    y += 8
    start = t_ms - window_ms
    x_of = lambda t: LEFT + PLOT_W * (t - start) / window_ms  # noqa: E731  (the window, drawn large)
    for lane in rec.lanes:
        h = THIN_H if lane.endswith(WORKER) else LANE_H
        parts.append(f'<text x="{LEFT - 6}" y="{y + h / 2 + 4}" text-anchor="end">{html.escape(lane_words(lane))}'
                     f'</text><rect x="{LEFT}" y="{y}" width="{PLOT_W}" height="{h}" fill="#fafafa" stroke="#eee"/>')
        for s in rec.spans:
            if s.lane != lane or s.end <= start or s.start >= t_ms:
                continue
            x = x_of(max(s.start, start))
            width = max(x_of(min(s.end, t_ms)) - x, 0.6)
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{h}" fill="{COLOURS[s.kind]}">'
                         f'<title>{html.escape(WORDS.get(s.kind, s.kind))}: {s.end - s.start:.3f} ms</title></rect>')
        y += h + 3
    if t_ms > rec.wall_ms:
        parts.append(f'<text x="{LEFT + PLOT_W}" y="{y - 6}" text-anchor="end" fill="#c00">run over at '
                     f'{rec.wall_ms:.0f} ms</text>')
    return parts, y + 4


def _axis(y: float, t_ms: float, window_ms: float) -> list[str]:
    start = t_ms - window_ms
    step = next(s for s in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if window_ms / s <= 10)
    parts = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}" stroke="#999"/>']
    tick = math.ceil(max(start, 0) / step) * step
    while tick <= t_ms + 1e-9:
        x = LEFT + PLOT_W * (tick - start) / window_ms
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#999"/>'
                     f'<text x="{x:.1f}" y="{y + 15}" text-anchor="middle" fill="#555">{tick:g} ms</text>')
        tick += step
    return parts


def render_frame(recordings: Sequence[Recording], t_ms: float, window_ms: float) -> str:
    """SVG of every recording's run from `t_ms - window_ms` to `t_ms` (ms from each run's start), under an
    overview of the whole run with that window outlined."""
    span_ms = max(r.wall_ms for r in recordings)
    parts: list[str] = []
    y = 22.0
    for rec in recordings:
        panel, y = _panel(rec, y, t_ms, window_ms, span_ms)
        parts += panel
        parts += _axis(y, t_ms, window_ms)
        y += 30
    x = LEFT
    for group, kinds in (("front end", FRONT_END_KINDS), ("core", CORE_KINDS)):
        parts.append(f'<text x="0" y="{y + 9}" fill="#333">{group}:</text>')
        for kind in kinds:
            words = WORDS.get(kind, kind)
            parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{COLOURS[kind]}"/>'
                         f'<text x="{x + 14}" y="{y + 9}">{html.escape(words)}</text>')
            x += 26 + 6 * len(words)
        x, y = LEFT, y + 16
    height, width = y + 4, LEFT + PLOT_W + 30  # room for the last tick's label
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="core-timeline" width="{width}" height="{height:.0f}" '
            f'viewBox="0 0 {width} {height:.0f}" style="max-width:100%;height:auto" data-step="{t_ms:.1f}" '
            'font-family="sans-serif" font-size="11">'
            f'<text x="0" y="12" font-weight="bold">{max(t_ms - window_ms, 0):.1f} – {t_ms:.1f} ms of each run '
            '(the red box in its overview)</text>')
    return head + "".join(parts) + "</svg>"


class CoreTimeline(Animation):
    """The recordings' runs on one clock, a window of `window_ms` sliding over them in up to `max_frames`
    frames; it opens at the start (▶ then plays the whole runs), and its still picture shows their middle."""

    def __init__(self, recordings: Sequence[Recording], window_ms: float = 25.0, max_frames: int = 40,
                 interval_ms: int = 300):
        if not recordings or any(not r.spans or r.wall_ms <= 0 for r in recordings):
            raise ValueError("every recording needs at least one span and a run longer than 0 ms")
        times = frame_times(max(r.wall_ms for r in recordings), window_ms, max_frames)
        labels = [f"{max(t - window_ms, 0):.1f} – {t:.1f} ms" for t in times]
        middle = len(times) // 2
        super().__init__([[render_frame(recordings, t, window_ms) for t in times]], labels, still=middle,
                         interval_ms=interval_ms, start=0)
