"""Quantization on a real row of weights, scheme by scheme: the values the codes can take, where each
weight lands, and what every scheme costs in error against bytes per weight.

    int4 groups of 32, asymmetric · 0.750 bytes per weight · error 7.9% of the weights' RMS
    ┌ one row's first 64 weights ───────────────┐   ┌ every scheme: error against bytes ┐
    │ ─ ─ ─ levels its run's scale allows ─ ─ ─ │   │  ·   ·                            │
    │   ○ the weight   ▬ its code's value       │   │        ● this scheme              │
    └────────────────────────────────────────────┘   └──────────────────────────────────┘

A frame is anything with the attributes of `experiments/ch12.py::GridFrame`. `render_frame(frames, i)` is
pure and returns an SVG string; `QuantizationGrid` precomputes the frames and plays them with
`widgets/animation.py`, so it plays without a kernel.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from widgets.animation import Animation

WIDTH, HEIGHT = 880, 316
ROW_LEFT, ROW_RIGHT, TOP, BOTTOM = 52, 560, 40, 250  # the row panel
SCATTER_LEFT, SCATTER_RIGHT = 620, 870
WEIGHT, CODE, LEVEL, CURRENT, OTHER = "#555", "#4c78a8", "#c9d6e8", "#d62728", "#9aa5b1"
BITS_COLOR = {8: "#2a9d4b", 4: "#4c78a8", 3: "#e08a1e"}


def _y(value: float, low: float, high: float) -> float:
    return BOTTOM - (value - low) / (high - low) * (BOTTOM - TOP) if high > low else (TOP + BOTTOM) / 2


def render_frame(frames: Sequence[Any], index: int, title: str = "") -> str:
    """SVG of frame `index`: its row of weights against the levels its scheme allows, and every frame's
    scheme as a point of error against bytes per weight, this one in red."""
    if not frames:
        raise ValueError("the explorer needs at least one frame")
    index = range(len(frames))[index]
    frame = frames[index]
    values, quantized = list(frame.values), list(frame.quantized)
    if not values or len(values) != len(quantized):
        raise ValueError("a frame needs as many quantized values as weights, at least one")
    reach = max(max(abs(v) for v in values + quantized), 1e-12) * 1.08
    low, high = -reach, reach
    n = len(values)
    step = (ROW_RIGHT - ROW_LEFT) / n
    heading = f"{title} · " if title else ""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="quantization-grid" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" style="max-width:100%;height:auto" data-step="{index}" '
             'font-family="sans-serif" font-size="12">',
             f'<text x="0" y="16" font-weight="bold">{html.escape(heading + frame.label)} · '
             f'{frame.bytes_per_weight:.3f} bytes per weight · error {frame.error:.1%} of the weights\' RMS</text>',
             f'<rect x="{ROW_LEFT}" y="{TOP}" width="{ROW_RIGHT - ROW_LEFT}" height="{BOTTOM - TOP}" fill="#fcfcfc" '
             'stroke="#ddd"/>',
             f'<line x1="{ROW_LEFT}" y1="{_y(0, low, high):.1f}" x2="{ROW_RIGHT}" y2="{_y(0, low, high):.1f}" '
             'stroke="#bbb" stroke-dasharray="2 3"/>',
             f'<text x="{ROW_LEFT - 4}" y="{_y(0, low, high) + 4:.1f}" text-anchor="end" fill="#777" '
             'font-size="10">0</text>',
             f'<text x="{ROW_LEFT - 4}" y="{TOP + 10}" text-anchor="end" fill="#777" font-size="10">{high:+.2f}</text>',
             f'<text x="{ROW_LEFT - 4}" y="{BOTTOM}" text-anchor="end" fill="#777" font-size="10">{low:+.2f}</text>']
    # the levels each run's scale allows (only those inside the panel), as faint lines over the run's columns
    level_path = []
    for start, end, levels in frame.levels:
        x0, x1 = ROW_LEFT + start * step, ROW_LEFT + min(end, n) * step
        for level in levels:
            if low <= level <= high:
                y = _y(level, low, high)
                level_path.append(f"M{x0:.1f} {y:.1f}H{x1:.1f}")
        if start > 0:
            parts.append(f'<line x1="{x0:.1f}" y1="{TOP}" x2="{x0:.1f}" y2="{BOTTOM}" stroke="#999" '
                         'stroke-dasharray="4 3"/>')
    parts.append(f'<path d="{" ".join(level_path)}" stroke="{LEVEL}" stroke-width="1"/>')
    for i, (v, q) in enumerate(zip(values, quantized)):
        x = ROW_LEFT + (i + 0.5) * step
        yv, yq = _y(v, low, high), _y(q, low, high)
        parts.append(f'<line x1="{x:.1f}" y1="{yv:.1f}" x2="{x:.1f}" y2="{yq:.1f}" stroke="{CURRENT}" '
                     'stroke-width="1"/>'
                     f'<rect x="{x - step * 0.4:.1f}" y="{yq - 1.5:.1f}" width="{step * 0.8:.1f}" height="3" '
                     f'fill="{CODE}"/><circle cx="{x:.1f}" cy="{yv:.1f}" r="2.2" fill="none" stroke="{WEIGHT}"/>')
    runs = len(frame.levels)
    count = len(frame.levels[0][2]) if frame.levels else 0
    grid = (f"faint lines: the {count} values each group's scale allows (dashed: a new group, a new scale)"
            if runs > 1 else f"faint lines: the {count} values its scale allows")
    parts.append(f'<text x="{ROW_LEFT}" y="{BOTTOM + 16}" fill="#333">one row\'s first {n} weights: ○ the weight, '
                 f'▬ what its code stands for, red: the error</text>'
                 f'<text x="{ROW_LEFT}" y="{BOTTOM + 31}" fill="#333">{html.escape(grid)}</text>')
    parts.append(_scatter(frames, index))
    parts.append(f'<text x="0" y="{HEIGHT - 6}" fill="#777" font-size="10">bytes per weight count the codes and the '
                 'float32 scales (and minima) beside them · error: RMS(quantized − weight) / RMS(weight), the whole '
                 'matrix</text>')
    parts.append("</svg>")
    return "".join(parts)


def _scatter(frames: Sequence[Any], index: int) -> str:
    """Every scheme as a point: bytes per weight across, error up (log scale); this frame's in red."""
    points = frames[index].all_errors
    xs = [b for _, b, _ in points]
    ys = [max(e, 1e-6) for _, _, e in points]
    x_low, x_high = min(xs) * 0.8, max(xs) * 1.1
    y_low, y_high = math.log10(min(ys)) - 0.2, math.log10(max(ys)) + 0.2

    def at(b: float, e: float) -> tuple[float, float]:
        x = SCATTER_LEFT + (b - x_low) / (x_high - x_low) * (SCATTER_RIGHT - SCATTER_LEFT)
        y = BOTTOM - (math.log10(max(e, 1e-6)) - y_low) / (y_high - y_low) * (BOTTOM - TOP)
        return x, y

    parts = [f'<rect x="{SCATTER_LEFT}" y="{TOP}" width="{SCATTER_RIGHT - SCATTER_LEFT}" height="{BOTTOM - TOP}" '
             'fill="#fcfcfc" stroke="#ddd"/>',
             f'<text x="{SCATTER_LEFT - 30}" y="{TOP - 6}" fill="#333">every scheme: error (log) vs bytes per weight'
             '</text>']
    for decade in range(math.ceil(y_low), math.floor(y_high) + 1):
        y = BOTTOM - (decade - y_low) / (y_high - y_low) * (BOTTOM - TOP)
        parts.append(f'<line x1="{SCATTER_LEFT}" y1="{y:.1f}" x2="{SCATTER_RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{SCATTER_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#777" font-size="10">'
                     f'{10.0 ** decade:.0%}</text>')
    for b in (0.25, 0.5, 0.75, 1.0, 1.25):
        if x_low <= b <= x_high:
            x, _ = at(b, 1)
            parts.append(f'<text x="{x:.1f}" y="{BOTTOM + 14}" text-anchor="middle" fill="#777" '
                         f'font-size="10">{b:g}</text>')
    for i, (label, b, e) in enumerate(points):
        if i == index:
            continue
        x, y = at(b, e)
        bits = int(label.split()[0][3:]) if label.startswith("int") else 0
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{BITS_COLOR.get(bits, OTHER)}" '
                     f'fill-opacity="0.45"><title>{html.escape(label)}: {b:.3f} bytes, {e:.1%}</title></circle>')
    label, b, e = points[index]
    x, y = at(b, e)
    anchor = "end" if x > (SCATTER_LEFT + SCATTER_RIGHT) / 2 else "start"
    dx = -8 if anchor == "end" else 8
    parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5.5" fill="{CURRENT}"/>'
                 f'<text x="{x + dx:.1f}" y="{y - 8:.1f}" text-anchor="{anchor}" fill="{CURRENT}" font-size="11">'
                 f'{e:.1%}</text>')
    legend = " · ".join(f'<tspan fill="{color}">● int{bits}</tspan>' for bits, color in BITS_COLOR.items())
    parts.append(f'<text x="{SCATTER_LEFT}" y="{BOTTOM + 31}" font-size="10">{legend}'
                 '<tspan fill="#777"> · bytes per weight →</tspan></text>')
    return "".join(parts)


def short_label(label: str) -> str:
    """A scheme's name for the slider: 'int4 groups of 32, asymmetric' -> 'int4 · groups of 32 (asym.)'."""
    bits, _, rest = label.partition(" ")
    return f"{bits} · {rest.replace(', asymmetric', ' (asym.)')}"


def still_index(frames: Sequence[Any]) -> int:
    """A telling still picture: the first 4-bit scheme with more than one group in view (else the last frame)."""
    return next((i for i, f in enumerate(frames) if f.bits == 4 and len(f.levels) > 1), len(frames) - 1)


class QuantizationGrid(Animation):
    """Play the schemes of `experiments/ch12.py::grid_frames`, one frame each."""

    def __init__(self, frames: Sequence[Any], title: str = "", interval_ms: int = 1200):
        if not frames:
            raise ValueError("the explorer needs at least one frame")
        self.frames = list(frames)
        pictures = [render_frame(self.frames, i, title) for i in range(len(self.frames))]
        labels = [short_label(frame.label) for frame in self.frames]  # the slider is 480 px wide
        super().__init__([pictures], labels, still=still_index(self.frames), interval_ms=interval_ms)
