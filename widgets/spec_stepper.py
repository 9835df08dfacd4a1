"""Speculative decoding, step by step: what the proposer guessed, what the target kept, and what to
expect from an acceptance rate — replayed from a real engine trace (`StepRecord.speculation`).

    verification 7 / 31 · engine step 9: 3 of 4 guesses kept, 4 tokens from one target pass
    text       …the king is dead, long live the| king| and| all|
    guessed     [ king] [ and] [ all] [ his]           ✓ accepted  ✗ rejected  · not checked
    kept        [ king] [ and] [ all] [ the]           the last is the target's own: its correction
                                                       after a rejection, or a bonus after k accepted

`verdicts` and `verifications` are pure; `expected_tokens_per_pass` and `expected_speedup` are the
formulas of chapter 7. `SpecStepper` plays the verifications of one request (Play and a slider,
`widgets/animation.py`); `AcceptanceExplorer` draws the expected tokens per target pass and the
speedup against the acceptance rate, with a slider for the rate and the measured runs as points.
Both precompute their frames, so they work without a kernel.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as W

from minillm.trace import Trace
from widgets.animation import Animation, StillFallback

ACCEPTED, REJECTED, UNCHECKED, CORRECTION, BONUS = "accepted", "rejected", "not checked", "correction", "bonus"
COLOURS = {ACCEPTED: "#2a9d4b", REJECTED: "#d62728", UNCHECKED: "#bbbbbb", CORRECTION: "#e8871e", BONUS: "#4c78a8"}
CHAR_W, BOX_H, LEFT = 7.2, 20, 78  # monospace advance at font-size 12, one token box, the label column


@dataclass(frozen=True)
class Verification:
    step: int  # the engine step
    context: tuple[int, ...]  # the request's output tokens before this step
    guesses: tuple[int, ...]
    kept: tuple[int, ...]  # accepted guesses, then the target's own token


def verdicts(guesses: Sequence[int], kept: Sequence[int]) -> tuple[list[str], str]:
    """Per guess: accepted, rejected (the first the target refused) or not checked (after it); and
    what the last kept token is: the target's correction, or a bonus when every guess was kept.
    `kept` holds the accepted guesses and then one token of the target's (as the rule decided: a
    stop inside the run may have delivered fewer)."""
    accepted = 0
    while accepted < min(len(guesses), len(kept) - 1) and kept[accepted] == guesses[accepted]:
        accepted += 1
    marks = [ACCEPTED] * accepted
    if accepted < len(guesses):
        marks += [REJECTED] + [UNCHECKED] * (len(guesses) - accepted - 1)
    return marks, BONUS if accepted == len(guesses) else CORRECTION


def verifications(trace: Trace, request_id: str, output_token_ids: Sequence[int]) -> list[Verification]:
    """Every step in which `request_id` had guesses verified, with the output tokens it had before
    that step (`output_token_ids`: its final output; a step that gave it a token without guesses —
    its prefill, a step with no guess — counts one)."""
    found, count = [], 0
    for record in trace.steps:
        entry = record.speculation.get(request_id)
        if entry is not None:
            guesses, kept = entry
            found.append(Verification(record.step, tuple(output_token_ids[:count]), tuple(guesses), tuple(kept)))
            count += len(kept)
        elif any(s is not None and s.request_id == request_id and s.sampled and s.num_tokens for s in record.slots):
            count += 1
    return found


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Tokens one target pass yields when each guess is accepted with probability alpha, independently:
    1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)."""
    if not 0 <= alpha <= 1 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, draft_cost: float) -> float:
    """Tokens per unit of time against plain decoding, if a target pass over k + 1 tokens costs what a
    one-token step costs (the weights are read once either way) and each of the k draft passes costs
    `draft_cost` target steps."""
    return expected_tokens_per_pass(alpha, k) / (1 + k * draft_cost)


def _box(x: float, y: float, text: str, colour: str, dashed: bool = False) -> tuple[str, float]:
    w = max(len(text), 1) * CHAR_W + 8
    dash = ' stroke-dasharray="3,2"' if dashed else ""
    return (f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{BOX_H}" rx="3" fill="{colour}" fill-opacity="0.18" '
            f'stroke="{colour}"{dash}/><text x="{x + 4:.1f}" y="{y + 14}" font-family="monospace" font-size="12">'
            f"{html.escape(text)}</text>", w + 4)


def _shown(piece: str) -> str:
    return piece.replace("\n", "⏎").replace(" ", "␣") if piece.strip() == "" else piece.replace("\n", "⏎")


def render_verification(v: Verification, index: int, total: int, decode: Callable[[list[int]], str],
                        passes_so_far: int, tokens_so_far: int, prompt: Sequence[int] = (), width: int = 820,
                        tail_chars: int = 70) -> str:
    """SVG of one verification: the text so far (the tail of the prompt in grey, then the output), the
    guesses with their verdicts, the kept tokens, and the running tokens-per-pass."""
    marks, last = verdicts(v.guesses, v.kept)
    accepted = marks.count(ACCEPTED)
    written = decode(list(v.context))
    shown_prompt = decode(list(prompt))[-max(tail_chars - len(written), 0):] if prompt else ""
    if len(written) > tail_chars:
        shown_prompt, written = "", "…" + written[-tail_chars:]
    elif prompt and len(shown_prompt) < len(decode(list(prompt))):
        shown_prompt = "…" + shown_prompt
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="spec-stepper" width="{width}" height="166" '
             f'viewBox="0 0 {width} 166" style="max-width:100%;height:auto" data-step="{index}" '
             'font-family="sans-serif" font-size="12">',
             f'<text x="0" y="14" font-weight="bold">verification {index + 1} / {total} · engine step {v.step}: '
             f'{accepted} of {len(v.guesses)} guesses kept, {len(v.kept)} token{"s" * (len(v.kept) != 1)} from one '
             f'target pass</text>',
             f'<text x="{width - 4}" y="14" text-anchor="end" fill="#555">so far: {tokens_so_far} tokens in '
             f'{passes_so_far} pass{"es" * (passes_so_far != 1)} = {tokens_so_far / max(passes_so_far, 1):.2f} per '
             'pass</text>']
    # the text: its tail in grey, then the kept tokens boxed
    parts.append(f'<text x="0" y="44">text</text><text x="{LEFT}" y="44" font-family="monospace" font-size="12">'
                 f'<tspan fill="#aaa">{html.escape(_shown(shown_prompt))}</tspan>'
                 f'<tspan fill="#222">{html.escape(_shown(written))}</tspan></text>')
    rows = [("guessed", 58, list(zip(v.guesses, marks))), ("kept", 88, [(t, ACCEPTED) for t in v.kept[:-1]]
                                                           + [(v.kept[-1], last)] if v.kept else [])]
    for label, y, tokens in rows:
        parts.append(f'<text x="0" y="{y + 14}">{label}</text>')
        x = LEFT
        for token, mark in tokens:
            svg, w = _box(x, y, _shown(decode([token])), COLOURS[mark], dashed=mark == UNCHECKED)
            parts.append(f"<g><title>token {token}: {mark}</title>{svg}</g>")
            x += w
    x = 0
    for mark in (ACCEPTED, REJECTED, UNCHECKED, CORRECTION, BONUS):
        parts.append(f'<rect x="{x}" y="128" width="12" height="12" fill="{COLOURS[mark]}" fill-opacity="0.5"/>'
                     f'<text x="{x + 16}" y="139" fill="#555">{mark}</text>')
        x += 24 + len(mark) * 6.5
    parts.append('<text x="0" y="158" fill="#555">correction: the target\'s own token where it refused a guess · '
                 'bonus: its token after all k were kept · grey text: the prompt · ⏎ a line break, ␣ a space'
                 '</text></svg>')
    return "".join(parts)


class SpecStepper(Animation):
    """Play one request's verifications from a real trace (an engine with speculative decoding);
    `output_token_ids` (and `prompt_token_ids`): the request's output (and prompt), for the text so far."""

    def __init__(self, trace: Trace, request_id: str, output_token_ids: Sequence[int],
                 decode: Callable[[list[int]], str], prompt_token_ids: Sequence[int] = (), max_frames: int = 60,
                 interval_ms: int = 700):
        found = verifications(trace, request_id, output_token_ids)
        if not found:
            raise ValueError(f"request {request_id!r} had no verified guesses in this trace (is speculation on, "
                             "and was the trace long enough?)")
        frames, tokens = [], len(found[0].context)
        for i, v in enumerate(found[:max_frames]):
            tokens += len(v.kept)
            frames.append(render_verification(v, i, len(found), decode, i + 1, tokens - len(found[0].context),
                                              prompt_token_ids))
        self.verifications = found
        labels = [f"verification {i + 1} / {len(found)}" for i in range(len(frames))]
        super().__init__([frames], labels, interval_ms=interval_ms, still=min(len(frames), 8) - 1)


# ---------------------------------------------------------------------------------------------------- expectations

PLOT_W, PLOT_H, P_LEFT, P_TOP = 330, 190, 48, 30


def render_expectations(alpha: float, k: int, draft_cost: float, measured: Sequence[dict], max_k: int = 6) -> str:
    """Two plots against the acceptance rate: expected tokens per target pass for k = 1..max_k (k in
    bold), and the expected speedup for k at `draft_cost`; `measured`: dicts with label, alpha,
    tokens_per_pass and speedup (optional), drawn as points; a cursor at `alpha` with the values."""
    width, height = 2 * (P_LEFT + PLOT_W) + 30, P_TOP + PLOT_H + 72
    top_tokens = max_k + 1
    top_speedup = max(2.0, max((m.get("speedup") or 0 for m in measured), default=0) * 1.15,
                      expected_speedup(1.0, k, draft_cost) * 1.05)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="spec-expectations" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" data-step="{alpha:.2f}" '
             'font-family="sans-serif" font-size="11">']

    def panel(x0: float, title: str, top: float, curves: list[tuple[list[tuple[float, float]], str, float]],
              points: list[tuple[float, float, str]], readout: str, unit_line: float | None) -> None:
        X = lambda a: x0 + P_LEFT + PLOT_W * a  # noqa: E731, N806
        Y = lambda v: P_TOP + PLOT_H - PLOT_H * min(v / top, 1.0)  # noqa: E731, N806
        parts.append(f'<text x="{x0}" y="14" font-weight="bold">{html.escape(title)}</text>'
                     f'<rect x="{X(0)}" y="{P_TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="#fafafa" stroke="#ddd"/>')
        for a in (0, 0.25, 0.5, 0.75, 1):
            parts.append(f'<text x="{X(a):.1f}" y="{P_TOP + PLOT_H + 14}" text-anchor="middle">{a:g}</text>')
        parts.append(f'<text x="{X(0.5):.1f}" y="{P_TOP + PLOT_H + 28}" text-anchor="middle">α: the share of '
                     'examined guesses kept</text>')
        for v in range(0, int(top) + 1, max(1, int(top) // 6)):
            parts.append(f'<text x="{X(0) - 4:.1f}" y="{Y(v) + 4:.1f}" text-anchor="end">{v}</text>')
        if unit_line is not None:
            parts.append(f'<line x1="{X(0)}" y1="{Y(unit_line):.1f}" x2="{X(1)}" y2="{Y(unit_line):.1f}" '
                         'stroke="#999" stroke-dasharray="4,3"/>')
        for points_, colour, w in curves:
            path = " ".join(f"{X(a):.1f},{Y(v):.1f}" for a, v in points_)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="{w}"/>')
        for a, v, label in points:
            parts.append(f'<circle cx="{X(a):.1f}" cy="{Y(v):.1f}" r="4" fill="#d62728"><title>{html.escape(label)}: '
                         f'α {a:.2f}, {v:.2f}</title></circle>'
                         f'<text x="{X(a) + 6:.1f}" y="{Y(v) - 5:.1f}" fill="#d62728">{html.escape(label)}</text>')
        parts.append(f'<line x1="{X(alpha):.1f}" y1="{P_TOP}" x2="{X(alpha):.1f}" y2="{P_TOP + PLOT_H}" '
                     f'stroke="#c00"/><text x="{X(0):.1f}" y="{P_TOP + PLOT_H + 44}" fill="#c00">'
                     f'{html.escape(readout)}</text>')

    grid = [i / 50 for i in range(51)]
    curves = [([(a, expected_tokens_per_pass(a, j)) for a in grid], "#4c78a8" if j == k else "#b8c7dc",
               2.2 if j == k else 1.0) for j in range(1, max_k + 1)]
    panel(0, f"tokens per target pass, k = 1 … {max_k} (k = {k} bold)", top_tokens, curves,
          [(m["alpha"], m["tokens_per_pass"], m["label"]) for m in measured],
          f"α = {alpha:.2f}, k = {k}: {expected_tokens_per_pass(alpha, k):.2f} tokens per pass", 1.0)
    speedup = [([(a, expected_speedup(a, k, draft_cost)) for a in grid], "#2a9d4b", 2.2)]
    panel(P_LEFT + PLOT_W + 30, f"expected speedup, k = {k}, a draft pass = {draft_cost:.2f} of a target step",
          top_speedup, speedup, [(m["alpha"], m["speedup"], m["label"]) for m in measured if m.get("speedup")],
          f"α = {alpha:.2f}: {expected_speedup(alpha, k, draft_cost):.2f}x (below the dashed line: slower)", 1.0)
    parts.append(f'<text x="0" y="{height - 6}" fill="#555">curves: the formulas of section 1 (guesses accepted '
                 'independently with probability α); red points: measured runs (α: the share of examined guesses '
                 "kept)</text></svg>")
    return "".join(parts)


class AcceptanceExplorer(StillFallback, W.VBox):
    """A slider for the acceptance rate; the two plots of `render_expectations` follow it (linked in
    the browser: it works without a kernel)."""

    def __init__(self, k: int, draft_cost: float, measured: Sequence[dict] = (), max_k: int = 6,
                 start_alpha: float = 0.7):
        if k < 1 or k > max_k or draft_cost < 0:
            raise ValueError(f"need 1 <= k <= {max_k} and draft_cost >= 0, got k={k}, draft_cost={draft_cost}")
        alphas = [i / 20 for i in range(21)]
        frames = [render_expectations(a, k, draft_cost, measured, max_k) for a in alphas]
        start = min(range(len(alphas)), key=lambda i: abs(alphas[i] - start_alpha))
        self.stack = W.Stack([W.HTML(f) for f in frames], selected_index=start)
        self.slider = W.SelectionSlider(options=[f"α = {a:.2f}" for a in alphas], index=start,
                                        description="acceptance", layout=W.Layout(width="480px"))
        W.jslink((self.slider, "index"), (self.stack, "selected_index"))
        self._still = frames[start]
        super().__init__([self.slider, self.stack])

    def still_html(self) -> str:
        return self._still
