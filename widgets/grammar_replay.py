"""A constrained run, step by step: how much of the vocabulary the grammar allowed, which token was
chosen among the allowed ones, and where the grammar stood — replayed from a real run
(`experiments/ch11.py::replay` re-walks a fresh matcher over the run's output tokens).

    step 34 / 88 · chose 'ch' · the mask allowed 3 of 4,096 tokens
    tokens allowed  ▁▁█▁▁▃▁▁▁█▇▁▁ …          one bar per step, log scale; the red bar is this step
    output so far   {"tool": "summon", "arguments": {[ch]▌
    the grammar     $.arguments.… · open { { · inside a key · forces next: aracter": "
    allowed, most likely first (after the mask):  ch 60% ▇▇▇▇▇   c 40% ▇▇▇   cha 0% ▏
    unmasked, the model wanted '\\n' (24%); the allowed tokens held 0.7% of its probability

A step is anything with the attributes of `experiments/ch11.py::ReplayStep` (piece, text, allowed,
top, wanted, kept_mass, chosen_p, where, forced). `render_frame(steps, i, vocab_size)` is pure and
returns an SVG string; `GrammarReplay` precomputes the frames and plays them with
`widgets/animation.py` (Play and a slider linked in the browser), so it plays without a kernel.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from widgets.animation import Animation

WIDTH, LEFT, CHAR_W = 880, 112, 7.2  # the label column, a monospace advance at font-size 12
CHART_TOP, CHART_H = 30, 74
CHOSEN, ALLOWED, REFUSED, CURRENT = "#2a9d4b", "#4c78a8", "#d62728", "#d62728"


def shown(piece: str) -> str:
    """A token's text made visible: a line break as ⏎, a lone space as ␣ (a space inside text stays)."""
    piece = piece.replace("\n", "⏎")
    return piece.replace(" ", "␣") if piece.strip() == "" else piece


def percent(p: float) -> str:
    """A probability as a percentage, with a digit more where it is small ('42%', '0.7%', 'under 0.1%')."""
    if p >= 0.1 or p == 0:
        return f"{p:.0%}"
    if p >= 0.001:
        return f"{p:.1%}"
    return "under 0.1%"


def _log_share(allowed: int, vocab_size: int) -> float:
    """0 for one token allowed, 1 for the whole vocabulary: where a bar's top sits on the log axis."""
    return math.log(max(allowed, 1)) / math.log(vocab_size) if vocab_size > 1 else 1.0


def render_frame(steps: Sequence[Any], index: int, vocab_size: int, title: str = "") -> str:
    """SVG of step `index` of a replayed run: the allowed share of every step (this one in red), the
    output so far with the chosen token boxed, where the grammar stands, and the allowed tokens the
    model found most likely (after the mask), the chosen one in green."""
    if not steps:
        raise ValueError("a replay needs at least one step")
    index = range(len(steps))[index]
    step = steps[index]
    n = len(steps)
    height = 286
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="grammar-replay" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" style="max-width:100%;height:auto" data-step="{index}" '
             'font-family="sans-serif" font-size="12">']
    share = step.allowed / vocab_size
    parts.append(f'<text x="0" y="14" font-weight="bold">{html.escape(title + " · " if title else "")}step '
                 f'{index + 1} / {n} · chose {html.escape(repr(shown(step.piece)))} · the mask allowed '
                 f'{step.allowed:,} of {vocab_size:,} tokens ({share:.2%})</text>')

    # the allowed share of every step, one bar each, on a log axis from 1 token to the whole vocabulary
    plot_w = WIDTH - LEFT - 10
    bar_w = plot_w / n
    y_of = lambda frac: CHART_TOP + CHART_H * (1 - frac)  # noqa: E731
    parts.append(f'<text x="0" y="{CHART_TOP + 12}">tokens allowed</text>'
                 f'<text x="0" y="{CHART_TOP + 26}" fill="#777" font-size="10">per step, log scale</text>'
                 f'<rect x="{LEFT}" y="{CHART_TOP}" width="{plot_w}" height="{CHART_H}" fill="#fafafa" stroke="#ddd"/>')
    for count in (1, 10, 100, 1000, vocab_size):
        if count > vocab_size:
            continue
        y = y_of(_log_share(count, vocab_size))
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#777" font-size="10">'
                     f'{count:,}</text>')
    # every step's bar as one path (small frames: the widget stores every frame)
    path = " ".join(f"M{LEFT + i * bar_w + bar_w / 2:.1f} {y_of(0):.1f}V{y_of(_log_share(s.allowed, vocab_size)):.1f}"
                    for i, s in enumerate(steps) if s.allowed > 1)
    parts.append(f'<path d="{path}" stroke="{ALLOWED}" stroke-width="{max(min(bar_w - 1, 6), 1):.1f}" '
                 'stroke-opacity="0.55"/>')
    ones = " ".join(f"M{LEFT + i * bar_w + bar_w / 2:.1f} {y_of(0) - 2:.1f}h0.1"
                    for i, s in enumerate(steps) if s.allowed <= 1)
    if ones:  # one token allowed: a dot on the axis (the grammar forced it)
        parts.append(f'<path d="{ones}" stroke="#999" stroke-width="3" stroke-linecap="round"/>')
    x_now = LEFT + index * bar_w + bar_w / 2
    parts.append(f'<line x1="{x_now:.1f}" y1="{y_of(0):.1f}" x2="{x_now:.1f}" '
                 f'y2="{y_of(_log_share(step.allowed, vocab_size)) - (2 if step.allowed <= 1 else 0):.1f}" '
                 f'stroke="{CURRENT}" stroke-width="{max(min(bar_w, 6), 2.5):.1f}"/>'
                 f'<text x="{LEFT}" y="{CHART_TOP + CHART_H + 13}" fill="#777" font-size="10">step 1</text>'
                 f'<text x="{LEFT + plot_w}" y="{CHART_TOP + CHART_H + 13}" text-anchor="end" fill="#777" '
                 f'font-size="10">step {n} · grey dots: one token allowed (the grammar forced it)</text>')

    # the output so far, the chosen token boxed, a cursor after it
    y = CHART_TOP + CHART_H + 40
    piece = shown(step.piece)
    before = step.text.replace("\n", "⏎")
    room = int((WIDTH - LEFT - 12) / CHAR_W) - len(piece) - 2  # characters that fit before the token
    if len(before) > room:
        before = "…" + before[-(room - 1):]
    x_token = LEFT + len(before) * CHAR_W
    parts.append(f'<text x="0" y="{y}">output so far</text>'
                 f'<rect x="{x_token - 1:.1f}" y="{y - 13}" width="{len(piece) * CHAR_W + 2:.1f}" height="18" rx="3" '
                 f'fill="{CHOSEN}" fill-opacity="0.2" stroke="{CHOSEN}"/>'
                 f'<text x="{LEFT}" y="{y}" font-family="monospace" xml:space="preserve">{html.escape(before)}'
                 f'<tspan fill="{CHOSEN}" font-weight="bold">{html.escape(piece)}</tspan></text>'
                 f'<rect x="{x_token + len(piece) * CHAR_W + 2:.1f}" y="{y - 12}" width="2" height="15" fill="#333"/>')

    # where the grammar stands
    y += 26
    path_text, brackets, what = step.where
    forced = f" · forces next: {shown(step.forced)[:40]}{'…' if len(step.forced) > 40 else ''}" if step.forced else ""
    parts.append(f'<text x="0" y="{y}">the grammar</text>'
                 f'<text x="{LEFT}" y="{y}"><tspan font-family="monospace">{html.escape(path_text)}</tspan>'
                 f'<tspan fill="#555"> · open: </tspan><tspan font-family="monospace">{html.escape(brackets or "none")}'
                 f'</tspan><tspan fill="#555"> · {html.escape(what)}</tspan><tspan fill="#888" font-style="italic">'
                 f'{html.escape(forced)}</tspan></text>')

    # the most likely allowed tokens, after the mask
    y += 26
    parts.append(f'<text x="0" y="{y}">allowed, most</text><text x="0" y="{y + 14}">likely first</text>')
    x = LEFT
    for text, p in step.top:
        label = shown(text)
        colour = CHOSEN if text == step.piece else ALLOWED
        w_label = len(label) * CHAR_W + 6
        bar = 70 * p
        parts.append(f'<g><title>{html.escape(repr(text))}: {p:.1%} after the mask</title>'
                     f'<text x="{x}" y="{y + 4}" font-family="monospace" fill="{colour}" '
                     f'font-weight="{"bold" if colour == CHOSEN else "normal"}" xml:space="preserve">'
                     f'{html.escape(label)}</text>'
                     f'<rect x="{x + w_label:.1f}" y="{y - 7}" width="{max(bar, 1):.1f}" height="12" fill="{colour}" '
                     f'fill-opacity="0.6"/><text x="{x + w_label + max(bar, 1) + 3:.1f}" y="{y + 4}" fill="#333">'
                     f'{percent(p)}</text></g>')
        x += w_label + max(bar, 1) + 44
    if step.allowed > len(step.top):
        parts.append(f'<text x="{x}" y="{y + 4}" fill="#777">… and {step.allowed - len(step.top):,} more</text>')

    # what the model wanted without the mask
    y += 34
    wanted, p_wanted = step.wanted
    if wanted == step.piece:
        said = (f"unmasked, the model's favourite was this same token ({percent(p_wanted)}): here the mask changed "
                "nothing")
    else:
        said = (f"unmasked, the model's favourite was {repr(shown(wanted))} ({percent(p_wanted)}), which the grammar "
                "refused")
    parts.append(f'<text x="0" y="{y}">without the mask</text><text x="{LEFT}" y="{y}" fill="#333">'
                 f'{html.escape(said)}</text>'
                 f'<text x="{LEFT}" y="{y + 16}" fill="#333">the allowed tokens held {percent(step.kept_mass)} of its '
                 f'probability; the mask sets the rest to −∞, so they now share 100% (the chosen one '
                 f'{percent(step.chosen_p)})</text>')
    parts.append(f'<text x="0" y="{height - 6}" fill="#777" font-size="10">⏎ a line break, ␣ a space · the boxed '
                 'token is the one chosen at this step; the bar under the cursor in the chart is this step</text>')
    parts.append("</svg>")
    return "".join(parts)


def still_index(steps: Sequence[Any]) -> int:
    """A telling frame for a still picture: the step where the mask overruled the model most while
    still leaving it a choice (the least probability kept among steps with more than one token allowed)."""
    choices = [i for i, s in enumerate(steps) if s.allowed > 1 and s.wanted[0] != s.piece]
    return min(choices, key=lambda i: steps[i].kept_mass) if choices else 0


class GrammarReplay(Animation):
    """Play a replayed constrained run (`experiments/ch11.py::replay`), one frame per step."""

    def __init__(self, steps: Sequence[Any], vocab_size: int, title: str = "", interval_ms: int = 450):
        if not steps:
            raise ValueError("a replay needs at least one step")
        self.steps = list(steps)
        frames = [render_frame(self.steps, i, vocab_size, title) for i in range(len(self.steps))]
        labels = [f"step {i + 1} / {len(self.steps)}" for i in range(len(self.steps))]
        super().__init__([frames], labels, still=still_index(self.steps), interval_ms=interval_ms)
