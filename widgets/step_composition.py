"""Step composition: what each engine step ran, and what the decoding requests felt, replayed from
real engine traces (`minillm/trace.py`) on one time axis.

    ITL (ms)  ──────────╱╲──────────────        a grey line per request: for each of its tokens after
                                                  the first, the time since its previous one (a stall is
                                                  a peak; requests decoding together overlap)
    tokens    ▁▁▁▁▁▁▁▁█████████▁▁▁▁▁▁▁▁▁▁▁▁       one bar per step, as wide as the step took:
              ▁▁▁▁▁▁▁▁█████████▁▁▁▁▁▁▁▁▁▁▁▁       decode tokens (blue) under prefill tokens (a colour
              0 s ──────────────────────► t        per request), heights on a square-root scale

Unchunked, a long prompt arrives as one tall, wide bar — every decoding request waits for it, and
its line peaks. Chunked (chapter 6), the same prompt is a row of short bars, each with the decodes
underneath. `composition`, `inter_token_latencies` and `render_frame` are pure; the widget
precomputes frames and plays them with `widgets/animation.py`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from minillm.metrics import percentile
from minillm.trace import Trace
from widgets.animation import Animation
from widgets.slot_timeline import request_colour

PLOT_W, ITL_H, BAR_H, LEFT, TOP, GAP = 760, 90, 110, 64, 30, 26
DECODE = "#4c78a8"
ITL_COLOUR = "#444"


@dataclass(frozen=True)
class StepBar:
    start: float  # seconds since the trace's first step began
    duration: float
    decode_tokens: int
    prefill_tokens: tuple[tuple[str, int], ...]  # (request, prompt tokens it ran this step), in slot order

    @property
    def num_tokens(self) -> int:
        return self.decode_tokens + sum(n for _, n in self.prefill_tokens)


def composition(trace: Trace) -> list[StepBar]:
    """One bar per recorded step, times relative to the first one."""
    if not trace.steps:
        return []
    origin = trace.steps[0].start_time
    return [StepBar(s.start_time - origin, s.duration, s.decode_tokens, tuple(s.prefill_tokens.items()))
            for s in trace.steps]


def inter_token_latencies(trace: Trace) -> list[tuple[float, float, str]]:
    """(time of the token, seconds since that request's previous token, request) for every token after
    a request's first. A token comes at the end of the step that sampled it: a decode step, or the
    prefill chunk that reached the end of the prompt — or, after a preemption, of the recomputation,
    so the gap of a preempted request includes its whole wait."""
    if not trace.steps:
        return []
    origin, points, last_token = trace.steps[0].start_time, [], {}
    for record in trace.steps:
        end = record.start_time + record.duration - origin
        for state in record.slots:
            if state is None or state.num_tokens == 0 or not state.sampled:
                continue
            if state.request_id in last_token:
                points.append((end, end - last_token[state.request_id], state.request_id))
            last_token[state.request_id] = end
    return points


def _token_height(n: float, max_tokens: int) -> float:
    """Height in pixels of a stack of n tokens on the square-root scale of the bars (so that a step of
    8 decodes stays visible next to a 1,500-token prefill)."""
    return BAR_H * math.sqrt(max(n, 0) / max(max_tokens, 1))


def render_frame(trace: Trace, upto: float, title: str, time_span: float, max_tokens: int, max_itl: float) -> str:
    """SVG of the steps that began by `upto` seconds (a step still running is cut at `upto`).
    `time_span`, `max_tokens` and `max_itl` (seconds) fix the scales, so that panels drawn one
    above the other compare at a glance."""
    every_bar = composition(trace)
    run_end = every_bar[-1].start + every_bar[-1].duration if every_bar else 0.0
    bars = [b for b in every_bar if b.start <= upto]
    itls = [p for p in inter_token_latencies(trace) if p[0] <= upto + 1e-9]
    x_of = lambda t: LEFT + PLOT_W * t / max(time_span, 1e-9)  # noqa: E731
    bar_top = TOP + ITL_H + GAP
    width, height = LEFT + PLOT_W + 16, bar_top + BAR_H + 48
    worst = max((b.duration for b in bars), default=0.0)
    p99 = percentile([itl for _, itl, _ in itls], 99) if itls else 0.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="step-composition" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" data-step="{upto:.3f}" '
             f'data-steps="{len(bars)}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="0" y="14" font-weight="bold">{html.escape(title)}</text>',
             f'<text x="{width - 8}" y="14" text-anchor="end">at {upto:.2f} s: {len(bars)} steps · longest step '
             f'{worst * 1e3:.0f} ms · ITL p99 {p99 * 1e3:.0f} ms · the run ends at {run_end:.2f} s</text>']
    # the ITL panel: one line per request, all in one colour (requests decoding together overlap)
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{ITL_H}" fill="#fafafa" stroke="#ddd"/>')
    parts.append(f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end">{max_itl * 1e3:.0f} ms</text>'
                 f'<text x="{LEFT - 6}" y="{TOP + ITL_H}" text-anchor="end">0</text>'
                 f'<text x="4" y="{TOP + ITL_H / 2 + 4}">ITL</text>')
    by_request: dict[str, list[tuple[float, float]]] = {}
    for t, itl, rid in itls:
        by_request.setdefault(rid, []).append((t, itl))
    for rid, gaps in by_request.items():
        # a step line: each gap is a flat segment over the time the request waited (a stall is a plateau)
        y_of = lambda g: TOP + ITL_H - ITL_H * min(g / max(max_itl, 1e-9), 1.0)  # noqa: E731
        points = [point for t, itl in gaps for point in ((x_of(t - itl), y_of(itl)), (x_of(t), y_of(itl)))]
        worst_t, worst_gap = max(gaps, key=lambda g: g[1])
        tip = (f"<title>request {html.escape(rid)}: {len(gaps)} gaps between its tokens, median "
               f"{percentile([g for _, g in gaps], 50) * 1e3:.0f} ms, worst {worst_gap * 1e3:.0f} ms "
               f"(at {worst_t:.2f} s)</title>")
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{ITL_COLOUR}" stroke-opacity="0.6" '
                     f'stroke-width="1.2">{tip}</polyline>')
    # the bars: decode tokens at the bottom, prefill chunks stacked on top, on a square-root scale
    parts.append(f'<rect x="{LEFT}" y="{bar_top}" width="{PLOT_W}" height="{BAR_H}" fill="#fafafa" stroke="#ddd"/>')
    for tick in sorted({max_tokens, *(t for t in (8, 128, 512) if t < max_tokens / 1.5)}):
        y = bar_top + BAR_H - _token_height(tick, max_tokens)
        parts.append(f'<line x1="{LEFT - 3}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#999"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    parts.append(f'<text x="4" y="{bar_top + BAR_H / 2 + 4}">tokens</text>')
    for b in bars:
        x = x_of(b.start)
        w = max(1.0, x_of(min(b.start + b.duration, upto)) - x - 0.5)
        below = 0
        pieces = [("decode", b.decode_tokens, DECODE)] + [(rid, n, request_colour(rid)) for rid, n in b.prefill_tokens]
        for who, n, colour in pieces:
            if n == 0:
                continue
            y_low = bar_top + BAR_H - _token_height(below, max_tokens)
            below += n
            y = bar_top + BAR_H - _token_height(below, max_tokens)
            rect = f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{y_low - y:.1f}" fill="{colour}"'
            if who == "decode":
                parts.append(f"{rect}><title>{n} decode tokens; the step took {b.duration * 1e3:.1f} ms</title></rect>")
            else:
                parts.append(f"{rect}><title>request {html.escape(who)}: {n} prefill tokens in a step of "
                             f"{b.num_tokens} tokens that took {b.duration * 1e3:.1f} ms</title></rect>")
    cursor = x_of(upto)
    parts.append(f'<line x1="{cursor:.1f}" y1="{TOP}" x2="{cursor:.1f}" y2="{bar_top + BAR_H}" stroke="#c00" '
                 'stroke-width="1.2"/>')
    parts.append(f'<text x="{LEFT}" y="{height - 22}" fill="#555">grey: each request\'s wait for each of its '
                 'tokens, drawn over the time it waited · blue: decode tokens · other colours: one request\'s '
                 f'prefill</text><text x="{LEFT}" y="{height - 8}" fill="#555">(a prompt, a chunk, or a '
                 'recomputation after a preemption) · bar width: the step\'s time · bar height: √ scale · '
                 f'time axis: 0 to {time_span:.2f} s</text></svg>')
    return "".join(parts)


def time_labels(span: float, count: int) -> dict[str, float]:
    """`count` evenly spaced times from 0 to `span`, labelled "t s / span s" with as many decimals as
    keep neighbours apart (3, more for a run of a few milliseconds)."""
    gap = span / (count - 1)
    decimals = 3 if gap <= 0 else min(9, max(3, -math.floor(math.log10(gap))))
    times = [span * i / (count - 1) for i in range(count)]
    return {f"{t:.{decimals}f} s / {span:.{decimals}f} s": t for t in times}  # a zero span gives one frame


class StepComposition(Animation):
    """Animated step composition of one or more traces on one time axis (e.g. the same arrivals
    unchunked and chunked); the slider names the time shown."""

    def __init__(self, traces: dict[str, Trace], max_frames: int = 30, interval_ms: int = 250):
        if not traces or any(not t.steps for t in traces.values()):
            raise ValueError("every trace needs at least one recorded step")
        bars = {name: composition(t) for name, t in traces.items()}
        span = max(b[-1].start + b[-1].duration for b in bars.values())
        max_tokens = max(b.num_tokens for steps in bars.values() for b in steps)
        max_itl = max((itl for t in traces.values() for _, itl, _ in inter_token_latencies(t)), default=0.0)
        count = max(2, max_frames)
        labels = time_labels(span, count)
        self.times = list(labels.values())
        panels = [[render_frame(trace, t, name, span, max_tokens, max_itl) for t in self.times]
                  for name, trace in traces.items()]
        super().__init__(panels, list(labels), interval_ms=interval_ms, start=-1)  # opens on the whole run
