"""Fragmentation visualizer: one real engine trace replayed under three ways of placing KV memory.

    reserve    every request reserves max_model_len tokens     |AAaaaaaa|BBBbbbbb|CCcccccc|   a = reserved, unused
    first-fit  each request one contiguous run of its exact    |AAaBBBbb|  |CCcc|    |    holes between runs
               final size, placed in the first hole big enough
    paged      blocks of block_size tokens, anywhere           |AA|BB|CC|BB|AA|CC|B |       only last blocks part-empty

The trace (`minillm/trace.py`, from an engine with `kv="paged"`) says, step by step, which
requests hold KV and how many tokens each; the paged panel shows the engine's real block tables.
`replay(trace, policy)` is pure and returns one `MemoryFrame` per step; `render_frame(...)` draws
the three panels as one SVG string; `FragmentationVisualizer` animates them (`widgets/animation.py`,
like the slot timeline).

Internal fragmentation is memory allocated to a request but not holding its tokens; external
fragmentation is free memory that no single request can use because it is split into holes
(1 - largest hole / free memory; zero when any free unit serves anyone, as with blocks or
fixed slots).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from minillm.trace import Trace
from widgets.animation import Animation
from widgets.slot_timeline import frame_steps, request_colour

POLICIES = ("reserve", "first-fit", "paged")
TITLES = {"reserve": "max-length reservation", "first-fit": "contiguous, exact size (first fit)",
          "paged": "paged blocks"}


@dataclass(frozen=True)
class Segment:
    request_id: str
    start: int  # first token address
    length: int  # tokens allocated
    used: int  # of which hold live tokens


@dataclass(frozen=True)
class MemoryFrame:
    policy: str
    step: int
    capacity: int  # tokens of KV memory
    unit: int  # reserve: max_model_len; paged: block_size; first-fit: 1
    segments: tuple[Segment, ...]
    unplaced: tuple[str, ...]  # requests the engine ran that this policy had no room for

    @property
    def live(self) -> int:
        return sum(s.used for s in self.segments)

    @property
    def allocated(self) -> int:
        return sum(s.length for s in self.segments)

    @property
    def free(self) -> int:
        return self.capacity - self.allocated

    @property
    def num_requests(self) -> int:
        return len({s.request_id for s in self.segments})

    @property
    def internal_fragmentation(self) -> float:
        return (self.allocated - self.live) / self.allocated if self.allocated else 0.0

    def holes(self) -> list[tuple[int, int]]:
        """Free (start, length) runs, in address order."""
        holes, cursor = [], 0
        for s in sorted(self.segments, key=lambda s: s.start):
            if s.start > cursor:
                holes.append((cursor, s.start - cursor))
            cursor = max(cursor, s.start + s.length)
        if cursor < self.capacity:
            holes.append((cursor, self.capacity - cursor))
        return holes

    @property
    def external_fragmentation(self) -> float:
        if self.policy != "first-fit" or not self.free:
            return 0.0  # a free slot or block serves anyone
        return 1 - max(length for _, length in self.holes()) / self.free

    def fits(self, tokens: int) -> bool:
        """Could a new request of `tokens` tokens be placed now?"""
        if self.policy == "paged":
            return -(-tokens // self.unit) * self.unit <= self.free
        largest = max((length for _, length in self.holes()), default=0)
        if self.policy == "reserve":
            return tokens <= self.unit and largest >= self.unit
        return largest >= tokens


def replay(trace: Trace, policy: str) -> list[MemoryFrame]:
    """Place the trace's KV, step by step, under `policy` ("reserve", "first-fit" or "paged")."""
    if trace.block_size is None or trace.num_blocks is None or trace.max_model_len is None:
        raise ValueError("replay needs a trace from an engine with kv='paged' (it records block tables)")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    capacity = trace.num_blocks * trace.block_size
    final = {}  # a request's largest size in the trace: what an exact-size allocator would have reserved
    for step in trace.steps:
        for rid, tokens in step.kv_tokens.items():
            final[rid] = max(final.get(rid, 0), tokens)
    placed: dict[str, int] = {}  # request -> start address (reserve, first-fit)
    frames = []
    for step in trace.steps:
        live = {rid: tokens for rid, tokens in step.kv_tokens.items() if tokens > 0}
        if policy == "paged":
            segments = tuple(Segment(rid, block * trace.block_size, trace.block_size,
                                     min(trace.block_size, live.get(rid, 0) - i * trace.block_size))
                             for rid, table in step.blocks.items() if rid in live for i, block in enumerate(table))
            frames.append(MemoryFrame(policy, step.step, capacity, trace.block_size, segments, ()))
            continue
        for rid in [r for r in placed if r not in live]:  # finished or preempted: memory comes back
            del placed[rid]
        size = (lambda rid: trace.max_model_len) if policy == "reserve" else (lambda rid: final[rid])
        unplaced = []
        for rid in live:
            if rid not in placed:
                start = _first_fit(placed, size, size(rid), capacity, trace.max_model_len if policy == "reserve" else 1)
                if start is None:
                    unplaced.append(rid)
                else:
                    placed[rid] = start
        segments = tuple(Segment(rid, start, size(rid), min(live[rid], size(rid))) for rid, start in placed.items())
        unit = trace.max_model_len if policy == "reserve" else 1
        frames.append(MemoryFrame(policy, step.step, capacity, unit, segments, tuple(unplaced)))
    return frames


def _first_fit(placed: dict[str, int], size, need: int, capacity: int, align: int) -> int | None:
    """Lowest start address (a multiple of `align`) where `need` tokens fit between placed runs."""
    runs = sorted((start, start + size(rid)) for rid, start in placed.items())
    cursor = 0
    for start, end in [*runs, (capacity, capacity)]:
        if start - cursor >= need:
            return cursor
        cursor = max(cursor, -(-end // align) * align)
    return None


# ---------------------------------------------------------------------- drawing
CELL_W, CELL_H, ROW_TOKENS, PANEL_GAP, TOP = 4, 7, 64, 20, 34


def _rects(start: int, length: int, fill: str, opacity: float, x0: int, title: str = "") -> list[str]:
    """A token range as one rectangle per grid row it spans."""
    out, pos, end = [], start, start + length
    tooltip = f"<title>{title}</title>" if title else ""
    while pos < end:
        row, col = divmod(pos, ROW_TOKENS)
        n = min(end - pos, ROW_TOKENS - col)
        out.append(f'<rect x="{x0 + col * CELL_W}" y="{TOP + row * CELL_H}" width="{n * CELL_W}" height="{CELL_H}" '
                   f'fill="{fill}" fill-opacity="{opacity}">{tooltip}</rect>')
        pos += n
    return out


def _panel(frame: MemoryFrame, x0: int, probe: int | None) -> list[str]:
    rows = -(-frame.capacity // ROW_TOKENS)
    width, height = ROW_TOKENS * CELL_W, rows * CELL_H
    parts = [f'<text x="{x0}" y="{TOP - 8}" font-weight="bold">{html.escape(TITLES[frame.policy])}</text>',
             f'<rect x="{x0}" y="{TOP}" width="{width}" height="{height}" fill="#fff" stroke="#999"/>']
    for s in frame.segments:
        colour, name = request_colour(s.request_id), html.escape(s.request_id)
        parts += _rects(s.start, s.length, colour, 0.25, x0)
        parts += _rects(s.start, s.used, colour, 1.0, x0, f"request {name}: {s.used} live of {s.length} allocated")
    if frame.policy == "paged" and ROW_TOKENS % frame.unit == 0:  # block boundaries: columns of the grid
        for col in range(frame.unit, ROW_TOKENS, frame.unit):
            parts.append(f'<line x1="{x0 + col * CELL_W}" y1="{TOP}" x2="{x0 + col * CELL_W}" y2="{TOP + height}" '
                         f'stroke="#fff" stroke-width="1"/>')
    y = TOP + height + 16
    plural = "" if frame.num_requests == 1 else "s"
    lines = [f"{frame.num_requests} request{plural} · live {frame.live} / allocated {frame.allocated}"
             f" of {frame.capacity}",
             f"internal fragmentation {frame.internal_fragmentation:.0%} · external {frame.external_fragmentation:.0%}"]
    if frame.unplaced:
        lines.append(f"no room for {len(frame.unplaced)} running request(s)")
    if probe is not None:
        lines.append(f"can a {probe}-token request D fit? {'yes ✓' if frame.fits(probe) else 'no ✗'}")
    for i, line in enumerate(lines):
        colour = "#c00" if ("no room" in line or "no ✗" in line) else "#222"
        parts.append(f'<text x="{x0}" y="{y + 15 * i}" fill="{colour}">{html.escape(line)}</text>')
    return parts


def _legend(width: int) -> list[str]:
    """Swatches, top right: what the shades of a request's colour mean."""
    items = [("#4477aa", 1.0, "live token (K/V held)"), ("#4477aa", 0.25, "allocated, not holding a token"),
             ("#ffffff", 1.0, "free")]
    parts, x = [], width - 470
    for fill, opacity, label in items:
        parts.append(f'<rect x="{x}" y="3" width="11" height="11" fill="{fill}" fill-opacity="{opacity}" '
                     'stroke="#999"/>')
        parts.append(f'<text x="{x + 15}" y="12" fill="#555">{label}</text>')
        x += 20 + 6 * len(label)
    return parts


def render_frame(frames: dict[str, MemoryFrame], probe: int | None = None, title: str = "") -> str:
    """The policies' memory at one step, side by side, as an SVG string."""
    first = next(iter(frames.values()))
    rows = -(-first.capacity // ROW_TOKENS)
    panel_w = ROW_TOKENS * CELL_W
    width = len(frames) * (panel_w + PANEL_GAP)
    height = TOP + rows * CELL_H + 16 + 15 * 4 + 8
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="kv-memory" width="{width}" height="{height + 16}" '
             f'data-step="{first.step}" font-family="sans-serif" font-size="11">',
             f'<text x="0" y="12" fill="#555">{html.escape(title + " · " if title else "")}step {first.step} · '
             'each square is one token · one colour per request</text>', *_legend(width)]
    for i, frame in enumerate(frames.values()):
        parts += _panel(frame, i * (panel_w + PANEL_GAP), probe)
    parts.append("</svg>")
    return "".join(parts)


class FragmentationVisualizer(Animation):
    """The three policies replayed on one paged-engine trace, animated over the steps where some
    request holds KV; `probe` is the size of the request D whose fit each panel reports. The still
    picture (where widgets cannot render) is the step where the most KV was live."""

    def __init__(self, trace: Trace, probe: int | None = None, max_frames: int = 60, interval_ms: int = 200):
        busy = [i for i, step in enumerate(trace.steps) if step.kv_tokens]
        if not busy:
            raise ValueError("the trace holds no KV at any step: run some requests through the engine first")
        self.frames = {policy: replay(trace, policy) for policy in POLICIES}
        self.frame_steps = [busy[i] for i in frame_steps(len(busy), max_frames)]
        pages = [render_frame({p: f[s] for p, f in self.frames.items()}, probe) for s in self.frame_steps]
        peak = max(range(len(self.frame_steps)), key=lambda i: self.frames["paged"][self.frame_steps[i]].live)
        last = busy[-1]  # the last step holding KV: the frames stop there (step numbers start at 0, as in the trace)
        super().__init__([pages], [f"step {s} / {last}" for s in self.frame_steps], still=peak,
                         interval_ms=interval_ms)
