"""Speculative decoding, step by step: what the proposer guessed, what the target kept, and what to
expect from an acceptance rate — replayed from a real engine trace (`StepRecord.speculation`).

    verification 7 / 31 · engine step 9: 3 of 4 guesses kept, 4 tokens from one target pass
    text       …the king is dead, long live the| king| and| all|
    guessed     [ king] [ and] [ all] [ his]           ✓ accepted  ✗ rejected  · not checked
    kept        [ king] [ and] [ all] [ the]           the last is the target's own: its correction
                                                       after a rejection, or a bonus after k accepted

`verdicts` and `verifications` are pure; `expected_tokens_per_pass`, `expected_speedup`, `break_even`
and `fastest_k` are the formulas of chapter 7. `SpecStepper` plays the verifications of one request
(Play and a slider, `widgets/animation.py`); it precomputes its frames, so it plays without a
kernel. `AcceptanceExplorer` draws the expected tokens per target pass and the speedup against the
acceptance rate, says where the speedup crosses 1 and which k is fastest, with the measured runs as
points: its acceptance slider is linked in the browser (no kernel needed), its sliders for k and
the draft's cost redraw through the kernel (`render_expectations` is pure).
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


def expected_speedup(alpha: float, k: int, draft_cost: float, verify: float = 1.0) -> float:
    """Tokens per unit of time against plain decoding: what one round yields over what it costs, in
    one-token target passes — `verify` for the target's pass over k + 1 tokens (1.0: no more than a
    decode step, as a memory-bound pass nearly is) and `draft_cost` for each of the k draft passes."""
    if draft_cost < 0 or verify <= 0:
        raise ValueError(f"need draft_cost >= 0 and verify > 0, got draft_cost={draft_cost}, verify={verify}")
    return expected_tokens_per_pass(alpha, k) / (verify + k * draft_cost)


def break_even(k: int, draft_cost: float, verify: float = 1.0) -> float | None:
    """The α at which k guesses just pay for themselves (expected speedup 1): 0.0 when they cannot lose
    (a round costs no more than one plain step), None when not even α = 1 pays (k + 1 tokens for a
    round that costs at least k + 1 steps). The speedup grows with α, so it crosses 1 once at most."""
    cost = verify + k * draft_cost
    if cost <= 1:
        return 0.0
    if cost >= k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_pass(mid, k) < cost else (low, mid)
    return (low + high) / 2


def speedups_by_k(alpha: float, draft_cost: float, verify_cost: Sequence[float]) -> list[float]:
    """The expected speedup of every k from 0 (plain decoding) to len(verify_cost) - 1, where
    verify_cost[k] is a target pass over k + 1 tokens in one-token passes."""
    return [expected_speedup(alpha, k, draft_cost, verify_cost[k]) for k in range(len(verify_cost))]


def fastest_k(alpha: float, draft_cost: float, verify_cost: Sequence[float]) -> int:
    """The k with the highest expected speedup (the smallest such k), 0 unless some k beats plain decoding."""
    speedups, best = speedups_by_k(alpha, draft_cost, verify_cost), 0
    for k, s in enumerate(speedups):
        if s > speedups[best]:
            best = k
    return best


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

PLOT_W, PLOT_H, P_LEFT, P_TOP = 330, 190, 48, 34


def break_even_words(k: int, draft_cost: float, verify: float) -> str:
    """Where the speedup curve of `render_expectations` meets the dashed line of 1x, in words."""
    where = break_even(k, draft_cost, verify)
    cost = verify + k * draft_cost
    if where is None:
        return f"no α pays: {k + 1} tokens cannot repay a round of {cost:.2f} steps"
    if where == 0:
        return "never slower: a round costs no more than one plain step"
    return f"break-even at α = {where:.2f}: slower below it, faster above"


def render_expectations(alpha: float, k: int, draft_cost: float, measured: Sequence[dict], max_k: int = 6,
                        verify_cost: Sequence[float] | None = None) -> str:
    """Two plots against the acceptance rate: expected tokens per target pass for k = 1..max_k (k in
    bold), and the expected speedup for k at `draft_cost`, a target pass over j + 1 tokens costing
    `verify_cost[j]` one-token passes (default: all 1). `measured`: dicts with label, alpha,
    tokens_per_pass, speedup (optional) and k (optional: drawn only while the plots show that k), as
    points; a cursor at `alpha` with the values, where the speedup crosses 1, and the fastest k."""
    verify_cost = list(verify_cost) if verify_cost is not None else [1.0] * (max_k + 1)
    if len(verify_cost) < max_k + 1:
        raise ValueError(f"verify_cost needs max_k + 1 = {max_k + 1} entries (passes over 1..{max_k + 1} tokens), "
                         f"got {len(verify_cost)}")
    verify = verify_cost[k]
    shown = [m for m in measured if m.get("k") in (None, k)]
    width, height = 2 * (P_LEFT + PLOT_W) + 42, P_TOP + PLOT_H + 100  # room for the last tick label
    top_tokens = max_k + 1
    # the speedup axis depends on the costs, not on k, so that moving k moves the curve, not the axis
    top_speedup = max(2.0, max((m.get("speedup") or 0 for m in shown), default=0) * 1.15,
                      max(expected_speedup(1.0, j, draft_cost, verify_cost[j]) for j in range(1, max_k + 1)) * 1.05)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="spec-expectations" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" data-step="{alpha:.2f}" '
             'font-family="sans-serif" font-size="11">']

    def panel(x0: float, title: str, subtitle: str, top: float,
              curves: list[tuple[list[tuple[float, float]], str, float]], points: list[tuple[float, float, str]],
              readout: list[str], unit_line: float | None) -> tuple[Callable, Callable]:
        X = lambda a: x0 + P_LEFT + PLOT_W * a  # noqa: E731, N806
        Y = lambda v: P_TOP + PLOT_H - PLOT_H * min(v / top, 1.0)  # noqa: E731, N806
        parts.append(f'<text x="{x0}" y="12" font-weight="bold">{html.escape(title)}</text>'
                     f'<text x="{x0}" y="26" fill="#555">{html.escape(subtitle)}</text>'
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
                     'stroke="#c00"/>')
        for i, line in enumerate(readout):
            parts.append(f'<text x="{X(0) - P_LEFT + 4:.1f}" y="{P_TOP + PLOT_H + 44 + 14 * i}" '
                         f'fill="{"#c00" if i == 0 else "#333"}">{html.escape(line)}</text>')
        return X, Y

    grid = [i / 50 for i in range(51)]
    curves = [([(a, expected_tokens_per_pass(a, j)) for a in grid], "#4c78a8" if j == k else "#b8c7dc",
               2.2 if j == k else 1.0) for j in range(1, max_k + 1)]
    panel(0, f"tokens per target pass, k = 1 … {max_k} (k = {k} bold)", "(1 − α^(k+1)) / (1 − α): kept guesses + "
          "the target's token", top_tokens, curves,
          [(m["alpha"], m["tokens_per_pass"], m["label"]) for m in shown],
          [f"α = {alpha:.2f}, k = {k}: {expected_tokens_per_pass(alpha, k):.2f} tokens per pass"], 1.0)
    speedup = [([(a, expected_speedup(a, k, draft_cost, verify)) for a in grid], "#2a9d4b", 2.2)]
    best = fastest_k(alpha, draft_cost, verify_cost[: max_k + 1])
    fastest = expected_speedup(alpha, best, draft_cost, verify_cost[best])
    best_words = f"fastest here: k = {best} ({fastest:.2f}x)" if best else "fastest here: k = 0, no speculation"
    x0 = P_LEFT + PLOT_W + 30
    X, Y = panel(x0, f"expected speedup, k = {k}", f"c = {draft_cost:.2f} a draft pass; a pass over {k + 1} tokens: "
                 f"{verify:.2f} steps", top_speedup, speedup,
                 [(m["alpha"], m["speedup"], m["label"]) for m in shown if m.get("speedup")],
                 [f"α = {alpha:.2f}: {expected_speedup(alpha, k, draft_cost, verify):.2f}x; {best_words}",
                  break_even_words(k, draft_cost, verify)], 1.0)
    where = break_even(k, draft_cost, verify)
    if where is not None and 0 < where < 1:
        parts.append(f'<circle cx="{X(where):.1f}" cy="{Y(1):.1f}" r="3.5" fill="none" stroke="#333" '
                     f'stroke-width="1.5"><title>break-even: α {where:.2f}</title></circle>'
                     f'<text x="{X(where):.1f}" y="{Y(1) + 15:.1f}" text-anchor="middle" fill="#333">break-even '
                     f'{where:.2f}</text>')
    parts.append(f'<text x="0" y="{height - 20}" fill="#555">curves: the formulas of section 1, guesses kept '
                 'independently with probability α; dashed: 1 (plain decoding)</text>'
                 f'<text x="0" y="{height - 6}" fill="#555">red points: measured runs, shown while k is theirs (α: the '
                 "share of examined guesses kept)</text></svg>")
    return "".join(parts)


class AcceptanceExplorer(StillFallback, W.VBox):
    """Sliders for the acceptance rate, the guesses k and the draft's cost (and, given `verify_cost`,
    a choice of what verification costs); the two plots of `render_expectations` follow them. The
    acceptance slider is linked in the browser (it works without a kernel); k, the cost and the
    choice redraw the frames through the kernel."""

    GPU = "1 decode step (memory-bound)"
    MEASURED = "as measured on this machine"

    def __init__(self, k: int, draft_cost: float, measured: Sequence[dict] = (), max_k: int = 6,
                 start_alpha: float = 0.7, verify_cost: Sequence[float] | None = None, max_draft_cost: float = 1.0):
        if k < 1 or k > max_k or draft_cost < 0:
            raise ValueError(f"need 1 <= k <= {max_k} and draft_cost >= 0, got k={k}, draft_cost={draft_cost}")
        if verify_cost is not None and (len(verify_cost) < max_k + 1 or min(verify_cost) <= 0):
            raise ValueError(f"verify_cost needs {max_k + 1} positive entries (passes over 1..{max_k + 1} tokens), "
                             f"got {list(verify_cost)}")
        self.measured, self.max_k = list(measured), max_k
        self.verify_options = {self.GPU: [1.0] * (max_k + 1)}
        if verify_cost is not None:
            self.verify_options = {self.MEASURED: [float(v) for v in verify_cost[: max_k + 1]], **self.verify_options}
        self.alphas = [i / 20 for i in range(21)]
        start = min(range(len(self.alphas)), key=lambda i: abs(self.alphas[i] - start_alpha))
        self.stack = W.Stack([W.HTML() for _ in self.alphas], selected_index=start)
        self.slider = W.SelectionSlider(options=[f"α = {a:.2f}" for a in self.alphas], index=start,
                                        description="acceptance", layout=W.Layout(width="480px"))
        W.jslink((self.slider, "index"), (self.stack, "selected_index"))
        wide = {"style": {"description_width": "initial"}}
        self.k_slider = W.IntSlider(value=k, min=1, max=max_k, description="guesses k", **wide)
        self.cost_slider = W.FloatSlider(value=round(draft_cost, 2), min=0.0, max=max(max_draft_cost, draft_cost),
                                         step=0.01, readout_format=".2f", description="draft pass c", **wide)
        # buttons as wide as their labels (the default width cuts "as measured on this machine" short)
        self.verify_choice = W.ToggleButtons(options=list(self.verify_options), description="a pass over k+1 tokens:",
                                             style={"description_width": "initial", "button_width": "auto"})
        self.drawn = W.HTML()  # what the plots are drawn for: on a saved page, the kernel-side controls stay put
        for control in (self.k_slider, self.cost_slider, self.verify_choice):
            control.observe(lambda _: self.redraw(), names="value")
        self.redraw()
        controls = [W.HBox([self.k_slider, self.cost_slider])]
        if len(self.verify_options) > 1:
            controls.append(self.verify_choice)
        super().__init__([*controls, self.drawn, self.slider, self.stack])

    def drawn_words(self) -> str:
        """The line under the controls: the k, c and verification the plots below are drawn for, and that
        only the acceptance slider redraws without a running kernel."""
        verify = f", a pass over k+1 tokens {self.verify_choice.value}" if len(self.verify_options) > 1 else ""
        return (f"<p style='color:#555;font-size:90%;margin:2px 0'>The plots are drawn for <b>k = "
                f"{self.k_slider.value}</b>, <b>c = {self.cost_slider.value:.2f}</b>{verify}. Guesses k, draft pass c"
                f"{' and the buttons' if verify else ''} redraw through the kernel: on a saved page without one they "
                "move, but the plots stay as this line says; the acceptance slider works either way.</p>")

    def frames(self) -> list[str]:
        """One frame per acceptance rate, for the current k, draft cost and verification cost."""
        verify = self.verify_options[self.verify_choice.value]
        return [render_expectations(a, self.k_slider.value, self.cost_slider.value, self.measured, self.max_k, verify)
                for a in self.alphas]

    def redraw(self) -> None:
        frames = self.frames()
        for view, frame in zip(self.stack.children, frames):
            view.value = frame
        self.drawn.value = self.drawn_words()
        self._still = self.drawn.value + frames[self.stack.selected_index or 0]

    def still_html(self) -> str:
        return self._still
