"""Slot timeline: which request occupied which batch slot at every engine step, replayed from a
real engine trace (`minillm/trace.py`).

    slot 0  ███A███████░░░░░░░░░░░   █ a request running (dark edge: its prefill step)
    slot 1  ███B████████████████████  ░ held but idle (static batching keeps finished slots)
    slot 2  ██C█████░░░░░░░░░░░░░░░   blank: free
            step 0 ─────────────────► step N

`render_frame(trace, step)` is a pure function returning an SVG string. The widget precomputes
the frames and plays them with `widgets/animation.py` (Play and a step slider linked in the
browser), so the animation plays even in a notebook opened without a running kernel.
"""

from __future__ import annotations

import colorsys
import hashlib
import html

from minillm.trace import Trace
from widgets.animation import Animation

CELL_W, CELL_H, LEFT, TOP = 6, 22, 56, 26
IDLE, FREE = "#d9d9d9", "#ffffff"


def request_colour(request_id: str) -> str:
    """A stable, well-spread colour per request id (numbered ids step round the hue circle by the
    golden ratio, so neighbours never look alike)."""
    number = int(request_id) if request_id.isdigit() else int(hashlib.md5(request_id.encode()).hexdigest()[:8], 16)
    hue = (number * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.55, 0.65)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _runs(trace: Trace, slot: int, upto: int) -> list[tuple[int, int, str | None, str]]:
    """Merge consecutive steps of one slot with the same owner and state: (first, last, id, phase)."""
    runs: list[tuple[int, int, str | None, str]] = []
    for i, step in enumerate(trace.steps[: upto + 1]):
        state = step.slots[slot]
        key = (None, "free") if state is None else (state.request_id, "idle" if state.phase == "idle" else "busy")
        if runs and runs[-1][2:] == key and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i, *key)
        else:
            runs.append((i, i, *key))
    return runs


def render_frame(trace: Trace, step: int, title: str = "", total_steps: int | None = None) -> str:
    """SVG of the timeline from step 0 to `step` (inclusive); `total_steps` fixes the width so that
    two timelines drawn side by side share one time axis."""
    total = max(total_steps or len(trace.steps), 1)
    step = min(step, len(trace.steps) - 1)
    width, height = LEFT + total * CELL_W + 10, TOP + trace.num_slots * CELL_H + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="slot-timeline" width="{width}" height="{height}" '
             f'data-step="{step}" font-family="sans-serif" font-size="11">']
    shown = trace.steps[: step + 1]
    busy = sum(s.busy_slots for s in shown)
    util = busy / (len(shown) * trace.num_slots) if shown else 0.0
    parts.append(f'<text x="0" y="14" font-weight="bold">{html.escape(title)}</text>'
                 f'<text x="{width - 10}" y="14" text-anchor="end">step {step} / {len(trace.steps) - 1} · '
                 f'slot utilisation {util:.0%}</text>')
    for slot in range(trace.num_slots):
        y = TOP + slot * CELL_H
        parts.append(f'<text x="0" y="{y + 15}">slot {slot}</text>')
        parts.append(f'<rect x="{LEFT}" y="{y}" width="{total * CELL_W}" height="{CELL_H - 4}" fill="{FREE}" '
                     'stroke="#eee"/>')
        for first, last, request_id, state in _runs(trace, slot, step):
            if request_id is None:
                continue
            fill = IDLE if state == "idle" else request_colour(request_id)
            x, w = LEFT + first * CELL_W, (last - first + 1) * CELL_W
            parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{CELL_H - 4}" fill="{fill}">'
                         f'<title>request {html.escape(request_id)}: steps {first}-{last} {state}</title></rect>')
            if state == "busy" and w >= 24:
                parts.append(f'<text x="{x + 3}" y="{y + 13}" fill="white">{html.escape(request_id[:6])}</text>')
        for i, s in enumerate(shown):  # a dark tick where a request ran its prefill
            state = s.slots[slot]
            if state is not None and state.phase == "prefill":
                parts.append(f'<rect x="{LEFT + i * CELL_W}" y="{y}" width="2" height="{CELL_H - 4}" fill="#222"/>')
    cursor = LEFT + (step + 1) * CELL_W
    parts.append(f'<line x1="{cursor}" y1="{TOP - 4}" x2="{cursor}" y2="{TOP + trace.num_slots * CELL_H}" '
                 'stroke="#c00" stroke-width="1.5"/>')
    parts.append(f'<text x="{LEFT}" y="{height - 8}" fill="#555">grey: slot held but idle · white: free · '
                 'black tick: prefill</text></svg>')
    return "".join(parts)


def frame_steps(num_steps: int, max_frames: int) -> list[int]:
    """Which steps become frames: all of them, or an even subsample ending on the last step."""
    if num_steps <= max_frames:
        return list(range(num_steps))
    stride = num_steps / max_frames
    picks = sorted({min(num_steps - 1, round(i * stride)) for i in range(max_frames)} | {num_steps - 1})
    return picks


class SlotTimeline(Animation):
    """Animated slot timelines for one or more traces on a shared time axis (e.g. static vs
    continuous batching of the same requests); the slider names the engine step shown."""

    def __init__(self, traces: dict[str, Trace], max_frames: int = 80, interval_ms: int = 120):
        total = max(len(t.steps) for t in traces.values())
        self.frame_steps = frame_steps(total, max_frames)
        panels = [[render_frame(trace, s, name, total) for s in self.frame_steps] for name, trace in traces.items()]
        # step numbers start at 0, as in the trace and the chapters' tables
        super().__init__(panels, [f"step {s} / {total - 1}" for s in self.frame_steps], interval_ms=interval_ms)
