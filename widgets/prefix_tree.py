"""The prefix cache as a tree, replayed step by step from a real engine trace.

    step 12: request C admitted, 48 tokens found cached
    [ROMEO: Wha]──[t light th]──[rough yon ]──[window br]     each box one cached full block: its text,
        #0 held 2      #1 held 2     #4 held 1    #9 evict 1st    block id, holders, or its place in the
                   └──[ JULIET: ]──[...]                         eviction queue (1st = next to go)

The engine's trace (`minillm/trace.py`, from `EngineConfig(kv="paged", prefix_cache=True)`) records,
for every step, the block pool's events in order (`BlockPool.drain_events`): blocks cached, shared
by a hit, released to the eviction queue, evicted. `replay(trace)` rebuilds the tree and the queue
from them — pure, one `CacheFrame` per step; `render_frame(frame, decode)` draws one as SVG; and
`PrefixTreeWidget` animates the frames (`widgets/animation.py`): a new request's hit path lights up,
evicted blocks disappear.

A trace with n samples of one prompt (`SamplingParams(n=...)`) also has "fork" and "copy" events.
Its frames then carry every running sequence's block table, and the picture gains a grid below the
tree — one row per sequence that shares a block, one column per logical block — where a block held
by several sequences is purple ("shared ×3": three holders) and a block copied on write in this step sits
in its sequence's row, red-bordered, in the column of its source (red dashed in the other rows):

    q    [#0 shared ×3][#1 shared ×3][#3 copy of #2]    after the first decode step: q and q#1 wrote
    q#1  [#0 shared ×3][#1 shared ×3][#4 copy of #2]    into the shared partial block #2 and got
    q#2  [#0 shared ×3][#1 shared ×3][#2 own]           copies; q#2, its last holder, writes into #2
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minillm.trace import Trace
from widgets.animation import Animation
from widgets.slot_timeline import frame_steps

BOX_W, BOX_H, GAP_X, ROW_H, LEFT, TOP = 106, 46, 14, 56, 8, 34
LINE_CHARS = 14  # characters of a block's text per line; two lines are shown, the tooltip has it all
MAX_ROWS = 14
HELD, EVICTABLE, HIT, NEW = "#2a7", "#bbb", "#e67e22", "#1f77b4"
SHARED, COPY = "#8e44ad", "#c0392b"  # a block with several holders (fork traces); a block copied on write
CELL_W, CELL_H, CELL_GAP, LABEL_W, TABLE_ROW_H = 74, 30, 6, 96, 38  # the grid of block tables
MAX_TABLE_ROWS, MAX_TABLE_COLUMNS = 8, 12


@dataclass(frozen=True)
class TreeNode:
    block: int
    parent: int  # the parent block, -1 for a request's first block
    token_ids: tuple[int, ...]
    ref_count: int  # running requests holding it after the step
    lru_rank: int | None  # evictable: its place in the eviction queue (0 = next to go); None while held


@dataclass(frozen=True)
class CacheFrame:
    step: int
    nodes: tuple[TreeNode, ...]  # depth first, children in the order they were cached
    admitted: tuple[str, ...]
    cache_hits: dict[str, int]  # tokens each admitted request found cached
    hit_blocks: tuple[int, ...]  # blocks shared by a hit in this step
    new_blocks: tuple[int, ...]  # blocks cached in this step
    evicted: tuple[int, ...]  # blocks evicted (or forgotten with an evicted ancestor) in this step
    # a trace with forks (n samples of a prompt) only; empty otherwise, and the picture is the tree alone
    shows_tables: bool = False  # draw the block tables (the trace has "fork" or "copy" events)
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()  # every running sequence's block table after the step
    forks: tuple[tuple[str, str], ...] = ()  # (sample, the sequence it was forked from) in this step
    copies: tuple[tuple[int, int], ...] = ()  # (shared block, its copy) made on write in this step

    @property
    def held(self) -> int:
        return sum(1 for n in self.nodes if n.ref_count > 0)

    @property
    def evictable(self) -> int:
        return sum(1 for n in self.nodes if n.ref_count == 0)


def replay(trace: Trace) -> list[CacheFrame]:
    """The cached-block tree after each step of `trace` (which must start at the engine's step 0)."""
    if trace.num_dropped:
        raise ValueError(f"the trace dropped its first {trace.num_dropped} steps: the tree is rebuilt from step 0 "
                         "(raise EngineConfig.trace_max_steps)")
    parents: dict[int, int] = {}
    tokens: dict[int, tuple[int, ...]] = {}
    lru: list[int] = []
    frames = []
    forking = any(e[0] in ("fork", "copy") for step in trace.steps for e in step.kv_events)
    before: dict[str, tuple[int, ...]] = {}  # the block tables after the previous step
    for step in trace.steps:
        hit, new, evicted, copies = [], [], [], []
        for kind, block, *rest in step.kv_events:
            if kind == "copy":
                copies.append((block, rest[0]))
            elif kind == "hit":
                hit.append(block)
                if block in lru:
                    lru.remove(block)
            elif kind in ("evict", "forget"):
                evicted.append(block)
                parents.pop(block, None), tokens.pop(block, None)
                if block in lru:
                    lru.remove(block)
            elif kind == "cache":
                parents[block], tokens[block] = rest[0], tuple(rest[1])
                new.append(block)
            elif kind == "release":
                lru.append(block)
        holders = Counter(b for table in step.blocks.values() for b in table)
        rank = {block: i for i, block in enumerate(lru)}
        nodes = [TreeNode(b, parents[b], tokens[b], holders[b], rank.get(b)) for b in _depth_first(parents)]
        tables = tuple((rid, tuple(table)) for rid, table in step.blocks.items()) if forking else ()
        frames.append(CacheFrame(step.step, tuple(nodes), step.admitted, dict(step.cache_hits), tuple(hit),
                                 tuple(new), tuple(evicted), forking, tables,
                                 _forks(step.blocks, before, step.admitted) if forking else (), tuple(copies)))
        before = dict(step.blocks)
    return frames


def _forks(tables: dict[str, tuple[int, ...]], before: dict[str, tuple[int, ...]],
           admitted: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(sample, parent) for each sequence that appeared in this step without being admitted: a fork,
    whose table is its parent's (a sequence there before, or admitted in this same step)."""
    new = [rid for rid in tables if rid not in before and rid not in admitted]
    parents = [rid for rid in tables if rid not in new]
    return tuple((rid, parent) for rid in new
                 for parent in [next((p for p in parents if tables[p] == tables[rid]), None)] if parent is not None)


def _depth_first(parents: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for block, parent in parents.items():  # dicts keep insertion order: children in the order cached
        children.setdefault(parent, []).append(block)
    order, stack = [], list(reversed(children.get(-1, [])))
    while stack:
        block = stack.pop()
        order.append(block)
        stack.extend(reversed(children.get(block, [])))
    return order


def layout(nodes: Sequence[TreeNode]) -> dict[int, tuple[int, int]]:
    """(column, row) per block: the column is the depth; a first child stays on its parent's row,
    every other child opens a new row below — one row per branch."""
    place: dict[int, tuple[int, int]] = {}
    used_children: set[int] = set()
    next_row = 0
    for node in nodes:  # depth first: a parent is placed before its children
        if node.parent == -1:
            place[node.block] = (0, next_row)
            next_row += 1
        else:
            column, row = place[node.parent]
            if node.parent in used_children:
                row, next_row = next_row, next_row + 1
            used_children.add(node.parent)
            place[node.block] = (column + 1, row)
    return place


def _visible(text: str, width: int = LINE_CHARS) -> tuple[str, str]:
    """A block's text on two lines of `width` characters, newlines and tabs made visible."""
    shown = text.replace("\n", "⏎").replace("\t", "→")
    if len(shown) > 2 * width:
        shown = shown[: 2 * width - 1] + "…"
    return shown[:width], shown[width:]


def _ordinal(n: int) -> str:
    return f"{n}{'st' if n == 1 else 'nd' if n == 2 else 'rd' if n == 3 else 'th'}"


def render_frame(frame: CacheFrame, decode: Callable[[list[int]], str], last_step: int | None = None) -> str:
    """One frame as HTML: a header line, then the tree as SVG."""
    place = layout(frame.nodes)
    rows = max((r for _, r in place.values()), default=-1) + 1
    shown = {b: cr for b, cr in place.items() if cr[1] < MAX_ROWS}
    columns = max((c for c, _ in shown.values()), default=0) + 1
    width, height = LEFT + columns * (BOX_W + GAP_X), TOP + max(1, min(rows, MAX_ROWS)) * ROW_H + 8
    hits = set(frame.hit_blocks)
    parts = []
    for node in frame.nodes:
        if node.block not in shown:
            continue
        column, row = shown[node.block]
        x, y = LEFT + column * (BOX_W + GAP_X), TOP + row * ROW_H
        if node.parent == -1 and row > 0:  # a new tree: a prompt sharing no block with those above
            parts.append(f'<line x1="{LEFT}" y1="{y - 6}" x2="{width - 4}" y2="{y - 6}" stroke="#bbb" '
                         'stroke-dasharray="4 3"/>')
        if node.parent in shown:
            pc, pr = shown[node.parent]
            px, py = LEFT + pc * (BOX_W + GAP_X) + BOX_W, TOP + pr * ROW_H + BOX_H / 2
            parts.append(f'<path d="M{px},{py} H{x - GAP_X / 2} V{y + BOX_H / 2} H{x}" fill="none" stroke="#888"/>')
        fill = (SHARED if frame.shows_tables and node.ref_count > 1 else HELD) if node.ref_count else EVICTABLE
        stroke, stroke_width = (HIT, 3) if node.block in hits else (NEW, 3) if node.block in frame.new_blocks else (
            "#555", 1)
        status = f"held by {node.ref_count}" if node.ref_count else f"evict {_ordinal(node.lru_rank + 1)}"
        text = decode(list(node.token_ids))
        first, second = _visible(text)
        tip = html.escape(f"block {node.block}: {text!r} ({len(node.token_ids)} tokens), {status}")
        parts.append(f'<g><title>{tip}</title><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                     f'fill="{fill}" fill-opacity="0.35" stroke="{stroke}" stroke-width="{stroke_width}"/>'
                     f'<text x="{x + 5}" y="{y + 13}" font-size="11" font-family="monospace" xml:space="preserve">'
                     f'{html.escape(first)}</text>'
                     f'<text x="{x + 5}" y="{y + 26}" font-size="11" font-family="monospace" xml:space="preserve">'
                     f'{html.escape(second)}</text>'
                     f'<text x="{x + 5}" y="{y + 40}" font-size="10" fill="#333">#{node.block} · {status}</text></g>')
    if rows > MAX_ROWS:
        parts.append(f'<text x="{LEFT}" y="{height - 2}" font-size="11" fill="#666">… and {rows - MAX_ROWS} more '
                     'branches</text>')
    if not frame.nodes:
        parts.append(f'<text x="{LEFT}" y="{TOP + 16}" font-size="12" fill="#666">nothing cached yet</text>')
    legend = (f"<span style='color:{HELD}'>■</span> held by running requests &nbsp; "
              f"<span style='color:#999'>■</span> cached, evictable (nth = its place in the eviction queue) &nbsp; "
              f"<span style='color:{HIT}'>□</span> shared by a hit this step &nbsp; "
              f"<span style='color:{NEW}'>□</span> cached this step &nbsp; "
              "(hover over a block for its whole text; a dashed line separates prompts that share nothing)")
    if frame.shows_tables:
        grid, grid_width, grid_height = _tables_grid(frame, height)
        parts.append(grid)
        width, height = max(width, grid_width), height + grid_height
        legend += (f"<br><span style='color:{SHARED}'>■</span> held by several sequences (×3: three holders) "
                   f"&nbsp; <span style='color:{COPY}'>□</span> copied on write this step, in the column of its "
                   f"source (<span style='color:{COPY}'>┅</span> the source, in the rows that still hold it)")
    return (f"<div style='font-family:sans-serif;font-size:13px'><b>{_header(frame, last_step)}</b><br>"
            f"<span style='font-size:11px'>{legend}</span><br>"
            f"<svg class='prefix-tree' data-step='{frame.step}' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' style='max-width:100%;height:auto' "
            f"xmlns='http://www.w3.org/2000/svg'>{''.join(parts)}</svg></div>")


def _tables_grid(frame: CacheFrame, top: int) -> tuple[str, int, int]:
    """The block tables of the sequences that share a block (or were forked, or copied one, in this
    step) as SVG from y = `top`: one row per sequence, one column per logical block. Returns the
    SVG, its width and its height."""
    holders = Counter(b for _, table in frame.tables for b in table)
    copied = {copy: source for source, copy in frame.copies}
    sources = set(copied.values())
    involved = {rid for pair in frame.forks for rid in pair}
    rows = [(rid, table) for rid, table in frame.tables
            if rid in involved or any(holders[b] > 1 or b in copied for b in table)]
    y = top + 14
    parts = [f'<text class="block-tables" x="{LEFT}" y="{y}" font-size="12" fill="#333">block tables: one row per '
             'sequence that shares blocks, one column per logical block</text>']
    if not rows:
        parts.append(f'<text x="{LEFT}" y="{y + 22}" font-size="12" fill="#666">no running sequence shares a '
                     'block now</text>')
        return "".join(parts), LEFT + 520, 40
    width = LEFT + 520
    for r, (rid, table) in enumerate(rows[:MAX_TABLE_ROWS]):
        ry = y + 10 + r * TABLE_ROW_H
        label = rid if len(rid) <= 12 else rid[:11] + "…"
        parts.append(f'<g><title>{html.escape(rid)}: blocks {list(table)}</title><text x="{LEFT}" y="{ry + 19}" '
                     f'font-size="12" font-family="monospace">{html.escape(label)}</text></g>')
        for j, block in enumerate(table[:MAX_TABLE_COLUMNS]):
            x = LEFT + LABEL_W + j * (CELL_W + CELL_GAP)
            shared = holders[block] > 1
            status = (f"copy of #{copied[block]}" if block in copied else f"shared ×{holders[block]}" if shared
                      else "own")
            stroke, dash, stroke_width = ((COPY, "", 3) if block in copied else (COPY, ' stroke-dasharray="4 2"', 2)
                                          if block in sources else ("#555", "", 1))
            tip = (f"{rid}, logical block {j}: block {block}, "
                   + (f"a copy of block {copied[block]} made on write in this step" if block in copied
                      else f"held by {holders[block]} sequences" if shared else "held by this sequence alone"))
            parts.append(f'<g><title>{html.escape(tip)}</title><rect x="{x}" y="{ry}" width="{CELL_W}" '
                         f'height="{CELL_H}" rx="3" fill="{SHARED if shared else HELD}" fill-opacity="0.35" '
                         f'stroke="{stroke}" stroke-width="{stroke_width}"{dash}/>'
                         f'<text x="{x + 4}" y="{ry + 13}" font-size="11" font-family="monospace">#{block}</text>'
                         f'<text x="{x + 4}" y="{ry + 26}" font-size="10" fill="#333">{status}</text></g>')
            width = max(width, x + CELL_W + 4)
        if len(table) > MAX_TABLE_COLUMNS:
            x = LEFT + LABEL_W + MAX_TABLE_COLUMNS * (CELL_W + CELL_GAP)
            parts.append(f'<text x="{x}" y="{ry + 19}" font-size="11" fill="#666">+{len(table) - MAX_TABLE_COLUMNS}'
                         '</text>')
            width = max(width, x + 40)
    shown = min(len(rows), MAX_TABLE_ROWS)
    height = 10 + shown * TABLE_ROW_H + 18
    if len(rows) > MAX_TABLE_ROWS:
        parts.append(f'<text x="{LEFT}" y="{y + height - 14}" font-size="11" fill="#666">… and '
                     f'{len(rows) - MAX_TABLE_ROWS} more sequences</text>')
    return "".join(parts), width, height


def _header(frame: CacheFrame, last_step: int | None) -> str:
    said = [f"step {frame.step}" + (f" / {last_step}" if last_step is not None else "")]
    for request_id in frame.admitted:
        found = frame.cache_hits.get(request_id, 0)
        said.append(f"request {html.escape(request_id)} admitted, "
                    + (f"{found} tokens found cached" if found else "no hit"))
    if frame.new_blocks:
        said.append(f"{len(frame.new_blocks)} block{'s' if len(frame.new_blocks) > 1 else ''} cached")
    if frame.evicted:
        said.append(f"evicted {', '.join(f'#{b}' for b in frame.evicted)}")
    parents: dict[str, list[str]] = {}
    for child, parent in frame.forks:
        parents.setdefault(parent, []).append(child)
    tables = dict(frame.tables)
    for parent, children in parents.items():
        count = len(tables.get(parent, ()))
        said.append(f"{', '.join(html.escape(c) for c in children)} forked from {html.escape(parent)}, sharing its "
                    f"{count} block{'s' * (count != 1)}")
    if frame.copies:
        owner = {b: rid for rid, table in frame.tables for b in table}
        said.append("copy on write: " + ", ".join(
            f"#{source} → #{copy}" + (f" ({html.escape(owner[copy])})" if copy in owner else "")
            for source, copy in frame.copies))
    said.append(f"cache: {len(frame.nodes)} blocks, {frame.held} held, {frame.evictable} evictable")
    return " · ".join(said)


class PrefixTreeWidget(Animation):
    """The cached-block tree of a prefix-cache engine's trace, animated over the steps where the
    cache changed. `decode` turns a block's token ids into text (e.g. `tokenizer.decode`). The still
    picture (where widgets cannot render) is the frame with the most cached blocks — or, in a trace
    with forks, the first step that copied a block on write."""

    def __init__(self, trace: Trace, decode: Callable[[list[int]], str], max_frames: int = 40,
                 interval_ms: int = 600):
        if not any(step.kv_events for step in trace.steps):
            raise ValueError("the trace has no prefix-cache events: run requests through an engine with "
                             "EngineConfig(kv='paged', prefix_cache=True)")
        frames = replay(trace)
        # the steps where the picture changes (a hit, a block cached, evicted or released, an admission),
        # and always the last step, so the slider ends where the trace ends
        # (with forks: also a fork, a copy, or a block table that changed)
        changed = [i for i, f in enumerate(frames)
                   if i == 0 or i == len(frames) - 1 or f.nodes != frames[i - 1].nodes or f.admitted
                   or f.forks or f.copies or f.tables != frames[i - 1].tables]
        self.frames = frames
        self.frame_steps = [changed[i] for i in frame_steps(len(changed), max_frames)]
        last = frames[-1].step
        pages = [render_frame(frames[i], decode, last) for i in self.frame_steps]
        biggest = max(range(len(self.frame_steps)), key=lambda k: len(frames[self.frame_steps[k]].nodes))
        copying = [k for k, i in enumerate(self.frame_steps) if frames[i].copies]  # copy on write: the moment to see
        super().__init__([pages], [f"step {frames[i].step} / {last}" for i in self.frame_steps],
                         still=copying[0] if copying else biggest, interval_ms=interval_ms)
