"""Launch timeline: one real decode step as the profiler saw it, eager above, recorded below, on
one time axis (`minillm/graphs/step_profile.py` records them).

    eager, batch 1      |||||||||||||||||||||||||||||||||||||||||||||||||||   553 operators, 3.3 ms
    compiled, batch 1   [ |  |  |  |  |  |  |  |  |  ]                         79 operators, 1.5 ms
                        0 ms ─────────────────────────────────────────► t     (a red cursor sweeps it)

Each bar is one top-level operator dispatched from the host, as long as it took, coloured by what
it does: matrix multiplies, attention and the KV cache, element-wise and norms, and book-keeping
(copies, conversions, views). A compiled region is outlined; the bars inside it are the calls its
generated code still makes (pre-packed matmuls, attention); the rest of its work runs in fused
loops between them, without a dispatch. On a GPU a second row under each host row shows the
kernels the device ran — eager: one per operator; a CUDA Graph: the same kernels behind a single
launch. Playing it sweeps the cursor across the step, counting the operators launched so far.
"""

from __future__ import annotations

import html

from minillm.graphs.step_profile import Span, StepProfile
from widgets.animation import Animation

PLOT_W, LEFT, ROW_H, ROW_GAP, TOP = 700, 150, 18, 40, 34
KINDS = {  # (colour, what it covers); the first matching kind wins
    "matmul": ("#4c78a8", ("linear", "mm", "addmm", "matmul", "gemm", "mkl", "bmm")),
    "attention": ("#f58518", ("attention", "scaled_dot_product", "index_select", "index_put", "index_copy",
                              "store_kv", "paged", "softmax", "flash")),
    "element-wise": ("#54a24b", ("mul", "add", "sub", "div", "neg", "roll", "silu", "norm", "rsqrt", "pow",
                                 "mean", "cat", "embedding", "argmax", "where", "exp", "triton")),
    "book-keeping": ("#bab0ac", ()),  # copies, conversions, views, allocation: everything else
}


def kind_of(name: str) -> str:
    """The colour group of an operator (or a kernel) by its name."""
    lowered = name.lower()
    for kind, (_, words) in KINDS.items():
        if any(word in lowered for word in words):
            return kind
    return "book-keeping"


def _bars(spans: list[Span], y: float, upto_us: float, x_of) -> list[str]:
    parts = []
    for s in spans:
        if s.start_us > upto_us:
            break
        x = x_of(s.start_us)
        width = max(0.6, x_of(min(s.start_us + s.duration_us, upto_us)) - x)
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{ROW_H}" '
                     f'fill="{KINDS[kind_of(s.name)][0]}"/>')
    return parts


def render_frame(profiles: list[StepProfile], upto_us: float, span_us: float) -> str:
    """SVG of every profile's operators that started by `upto_us`; one time axis of `span_us`."""
    x_of = lambda t: LEFT + PLOT_W * min(t, span_us) / max(span_us, 1e-9)  # noqa: E731
    height = TOP + len(profiles) * ROW_GAP + sum(ROW_H + 6 for p in profiles if p.device) + 56
    width = LEFT + PLOT_W + 16
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="launch-timeline" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" data-step="{upto_us:.0f}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="0" y="14" font-weight="bold">one decode step, as torch.profiler recorded it: at '
             f'{upto_us / 1e3:.2f} ms</text>']
    y = TOP
    for profile in profiles:
        launched = sum(1 for s in profile.host if s.start_us <= upto_us)
        done = "" if upto_us < profile.wall_us else " — done"
        parts.append(f'<text x="0" y="{y + 13}" font-weight="bold">{html.escape(profile.label)}</text>'
                     f'<text x="{LEFT}" y="{y - 3}" fill="#333">{launched} of {profile.num_host_ops} operators '
                     f'launched, step {profile.wall_us / 1e3:.2f} ms{done}</text>')
        parts.append(f'<rect x="{LEFT}" y="{y}" width="{x_of(profile.wall_us) - LEFT:.1f}" height="{ROW_H}" '
                     'fill="#f4f4f4" stroke="#ddd"/>')
        for region in profile.compiled:
            x = x_of(region.start_us)
            parts.append(f'<rect x="{x:.1f}" y="{y - 2}" width="{x_of(region.start_us + region.duration_us) - x:.1f}" '
                         f'height="{ROW_H + 4}" fill="none" stroke="#333" stroke-dasharray="3,2">'
                         '<title>the compiled region</title></rect>')
        parts += _bars(profile.host, y, upto_us, x_of)
        y += ROW_H + 6
        if profile.device:
            parts.append(f'<text x="{LEFT - 6}" y="{y + 13}" text-anchor="end" fill="#555">GPU kernels</text>')
            parts += _bars(profile.device, y, upto_us, x_of)
            y += ROW_H + 6
        y += ROW_GAP - ROW_H - 6
    cursor = x_of(upto_us)
    parts.append(f'<line x1="{cursor:.1f}" y1="{TOP - 14}" x2="{cursor:.1f}" y2="{y - ROW_GAP + ROW_H + 10}" '
                 'stroke="#c00" stroke-width="1.2"/>')
    legend_y = y + 4
    x = LEFT
    for kind, (colour, _) in KINDS.items():
        parts.append(f'<rect x="{x}" y="{legend_y}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="{legend_y + 9}">{kind}</text>')
        x += 24 + 7 * len(kind)
    parts.append(f'<text x="{LEFT}" y="{legend_y + 26}" fill="#555">bar: one operator dispatched by the host, as '
                 'long as it ran (the profiler adds a little to each) · dashed: a compiled region · time axis: 0 '
                 f'to {span_us / 1e3:.2f} ms</text></svg>')
    return "".join(parts)


class LaunchTimeline(Animation):
    """The profiles' steps on one time axis, a cursor sweeping it in `frames` frames."""

    def __init__(self, profiles: list[StepProfile], frames: int = 16, interval_ms: int = 300):
        if not profiles or any(not p.host for p in profiles):
            raise ValueError("every profile needs at least one recorded operator")
        span = max(p.wall_us for p in profiles)
        count = max(2, min(frames, int(span) + 1))  # frames at least 1 µs apart, so that their labels differ
        times = [span * i / (count - 1) for i in range(count)]
        labels = [f"t = {t / 1e3:.2f} ms" for t in times]
        if len(set(labels)) != len(labels):
            labels = [f"t = {t:.0f} µs" for t in times]
        super().__init__([[render_frame(profiles, t, span) for t in times]], labels, interval_ms=interval_ms,
                         start=-1)  # opens on the whole step
