"""Serving simulator: throughput against tail latency, and the queue over time, from sliders
(chapter 9). Every point is a run of `minillm/sim/simulator.py` — the engine's real scheduler with
a step time fitted on the engine's own trace — so moving a slider re-plays the scheduler, not a formula.

    p99 TTFT ▲                 ●  <- the chosen rate          queue ▲      ╱╲╱╲___
             │            ●                                         │  ╱╲╱
             │ ●  ●  ●                                              │╱
             └──────────────► output tok/s                          └──────────► time

Left: one point per arrival rate (a sweep up to the chosen one and beyond): as the rate nears the
server's capacity, throughput stops growing and the tail latency climbs. Right: requests waiting
and running over the chosen rate's run.

A redraw takes seconds (more on a busy machine), so it runs in a helper thread: while it runs, the
old picture and numbers are greyed under a "simulating…" line, and slider changes that arrive
meanwhile are coalesced — the run in progress stops at its next point and only the latest
settings are simulated.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable

import ipywidgets as W

from minillm.config import EngineConfig
from minillm.metrics import percentile
from minillm.sim import SimRequest, SimSpeculation, StepTimeModel, simulate

PLOT_W, PLOT_H, LEFT, TOP = 330, 190, 56, 30
SWEEP = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)  # rates of the curve, as multiples of the chosen rate


SPREADS = ("uniform ±50%", "fixed", "long-tailed")


def _length(rng: random.Random, mean: int, spread: str) -> int:
    """One length of mean `mean`: exactly it, uniform within ±50%, or exponential (most short, a few
    long: a chat service's shape), capped at 4× the mean."""
    if spread == "fixed":
        return mean
    if spread == "long-tailed":
        return max(1, min(4 * mean, round(rng.expovariate(1 / mean))))
    return max(1, round(mean * rng.uniform(0.5, 1.5)))


def workload(rate: float, count: int, prompt_len: int, output_len: int, prefix_share: float, seed: int = 0,
             spread: str = SPREADS[0]) -> list[SimRequest]:
    """Seeded Poisson arrivals; prompt and output lengths of the given means, spread as `spread`
    says (one of SPREADS); a share of the requests starts with a common prefix of half the mean
    prompt (a system prompt)."""
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
    rng = random.Random(seed)
    out, clock = [], 0.0
    for _ in range(count):
        prompt = _length(rng, prompt_len, spread)
        shared = prompt_len // 2 if rng.random() < prefix_share else 0
        out.append(SimRequest(clock, max(prompt, shared + 1), _length(rng, output_len, spread), shared))
        clock += rng.expovariate(rate)
    return out


def requests_per_point(output_len: int) -> int:
    """200 requests a point, fewer when outputs are long (at least 50): a redraw stays a few seconds."""
    return max(50, min(200, 25_000 // output_len))


def run_point(step_time: StepTimeModel, rate: float, max_num_seqs: int, num_blocks: int, prompt_len: int,
              output_len: int, chunk: int, prefix_share: float, count: int = 200, block_size: int = 16,
              guesses: int = 0, acceptance: float = 0.7, spread: str = SPREADS[0]) -> dict:
    """One simulated run; `guesses` > 0 turns speculative decoding on (k guesses, each kept with
    probability `acceptance`, a draft pass costing 0.2 of a decode step)."""
    config = EngineConfig(kv="paged", max_num_seqs=max_num_seqs, block_size=block_size, prefix_cache=prefix_share > 0,
                          chunked_prefill=chunk > 0, max_tokens_per_prefill_chunk=max(chunk, 1))
    speculation = SimSpeculation(k=guesses, acceptance=acceptance) if guesses > 0 else None
    result = simulate(workload(rate, count, prompt_len, output_len, prefix_share, spread=spread), config, step_time,
                      max_model_len=4 * (prompt_len + output_len), num_blocks=num_blocks, speculation=speculation)
    latencies = [m.latency for m in result.metrics if m.latency is not None]
    return result.summary() | {"rate": rate, "latency_p99_s": percentile(latencies, 99), "queue": result.queue,
                               "itl_p99_s": percentile([gap for m in result.metrics for gap in m.itls], 99),
                               "longest_step_s": max((seconds for _, seconds, _, _ in result.steps), default=0.0),
                               "count": count}


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round tick values from 0 covering `top`: steps of 1, 2, 2.5 or 5 times a power of ten."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    rough = top / count
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)
    return [round(i * step, 12) for i in range(math.ceil(top / step - 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.3g}"


def _axes(x0: float, title: str, x_label: str, y_label: str, x_ticks: list[float], y_ticks: list[float]) -> list[str]:
    parts = [f'<text x="{x0}" y="16" font-weight="bold">{title}</text>',
             f'<rect x="{x0 + LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="#fafafa" stroke="#ddd"/>',
             f'<text x="{x0 + LEFT + PLOT_W / 2}" y="{TOP + PLOT_H + 30}" text-anchor="middle">{x_label}</text>',
             f'<text x="{x0 + 12}" y="{TOP + PLOT_H / 2}" transform="rotate(-90 {x0 + 12} {TOP + PLOT_H / 2})" '
             f'text-anchor="middle">{y_label}</text>']
    for tick in x_ticks:
        x = x0 + LEFT + PLOT_W * tick / x_ticks[-1]
        parts.append(f'<text x="{x:.1f}" y="{TOP + PLOT_H + 14}" text-anchor="middle" font-size="10">'
                     f'{_label(tick)}</text>')
    for tick in y_ticks:
        y = TOP + PLOT_H - PLOT_H * tick / y_ticks[-1]
        parts.append(f'<text x="{x0 + LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{_label(tick)}</text>'
                     f'<line x1="{x0 + LEFT}" x2="{x0 + LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    return parts


def average_queue(queue: list[tuple[float, int, int]], bins: int) -> list[tuple[float, float, float]]:
    """(time, waiting, running) averaged over `bins` equal stretches of the run, each state weighted by
    how long it held (until the next step): a readable line where the raw steps would be a barcode."""
    if not queue:
        return []
    end = queue[-1][0] or 1.0
    width = end / bins
    sums = [[0.0, 0.0, 0.0] for _ in range(bins)]  # (seconds covered, waiting-seconds, running-seconds)
    for (t, waiting, running), (t_next, *_) in zip(queue, queue[1:]):
        while t < t_next:
            index = min(bins - 1, int(t / width))
            piece = min(t_next, (index + 1) * width) - t
            if piece <= 0:  # t sits on the last bin's end
                break
            sums[index][0] += piece
            sums[index][1] += piece * waiting
            sums[index][2] += piece * running
            t += piece
    return [((i + 0.5) * width, w / d, r / d) for i, (d, w, r) in enumerate(sums) if d > 0]


def render(points: list[dict], chosen: dict) -> str:
    """SVG: the throughput / p99-latency curve of `points` with `chosen` marked, and its queue."""
    width, height = 2 * (LEFT + PLOT_W + 24), TOP + PLOT_H + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="serving-simulator" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" data-step="{chosen["rate"]:.3f}" '
             'font-family="sans-serif" font-size="11">']
    drawn = [p for p in points if p["requests"] and math.isfinite(p["ttft_p99_s"])]
    x_ticks = nice_ticks(max((p["output_token_throughput"] for p in drawn), default=0.0) * 1.05)
    y_ticks = nice_ticks(max((p["ttft_p99_s"] for p in drawn), default=0.0) * 1.05)
    parts += _axes(0, "p99 time to first token against throughput", "output tokens / s", "p99 TTFT (s)",
                   x_ticks, y_ticks)
    xy = [(LEFT + PLOT_W * p["output_token_throughput"] / x_ticks[-1],
           TOP + PLOT_H - PLOT_H * p["ttft_p99_s"] / y_ticks[-1]) for p in drawn]
    parts.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}" fill="none" stroke="#4c78a8"/>')
    for p, (x, y) in zip(drawn, xy):
        radius, colour = (5, "#d62728") if p is chosen else (3, "#4c78a8")
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius}" fill="{colour}">'
                     f'<title>{p["rate"]:.3g} req/s: {p["output_token_throughput"]:.0f} tok/s, p99 TTFT '
                     f'{p["ttft_p99_s"]:.2f} s</title></circle>')
    if not drawn:
        parts.append(f'<text x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H / 2}" text-anchor="middle" fill="#d62728">'
                     "no request completed: none fits in the KV blocks</text>")
    x0 = LEFT + PLOT_W + 24
    queue = average_queue(chosen["queue"], PLOT_W // 3)
    t_ticks = nice_ticks(chosen["queue"][-1][0] if chosen["queue"] else 0.0)
    q_ticks = nice_ticks(max((w + r for _, w, r in queue), default=0.0))
    parts += _axes(x0, f"requests over time at {chosen['rate']:.3g} req/s (averaged)", "time (s)", "requests",
                   t_ticks, q_ticks)
    for index, colour, label in ((1, "#e45756", "waiting"), (2, "#54a24b", "running")):
        path = " ".join(f"{x0 + LEFT + PLOT_W * q[0] / t_ticks[-1]:.1f},"
                        f"{TOP + PLOT_H - PLOT_H * q[index] / q_ticks[-1]:.1f}" for q in queue)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.4"/>'
                     f'<text x="{x0 + LEFT + PLOT_W}" y="{TOP - 6 - 12 * (2 - index)}" text-anchor="end" '
                     f'fill="{colour}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def capacity(step_time: StepTimeModel, max_num_seqs: int, prompt_len: int, output_len: int) -> float:
    """Requests per second the engine finishes with every slot busy — plain decoding, no prefix hits,
    KV never short: each request holds a slot for `output_len` steps of a full batch (one step's time
    shared by `max_num_seqs` requests), and its prompt costs `per_prompt_token` per token on top."""
    slots = max(1, max_num_seqs)
    context = prompt_len + output_len / 2  # a request's mean context over its decodes
    step = step_time.base + slots * (step_time.per_sequence + context * step_time.per_context_token)
    return 1.0 / (output_len * step / slots + prompt_len * step_time.per_prompt_token)


GREYED = '<div style="opacity:0.35">{}</div>'  # the previous settings' picture, while the new one is simulated


class ServingSimulator(W.VBox):
    """Sliders over the workload and the engine; each change re-runs the simulator and redraws — in a
    helper thread (`background`), the old picture greyed meanwhile and rapid changes coalesced."""

    def __init__(self, step_time: StepTimeModel, rate: float = 8.0, max_num_seqs: int = 16, num_blocks: int = 512,
                 prompt_len: int = 100, output_len: int = 64, chunk: int = 0, prefix_share: float = 0.0,
                 guesses: int = 0, acceptance: float = 0.7, spread: str = SPREADS[0], background: bool = True):
        self.step_time = step_time
        self.background = background
        self.sliders = {
            "rate": W.FloatLogSlider(value=rate, base=2, min=-2, max=7, description="arrivals / s"),
            "max_num_seqs": W.IntSlider(value=max_num_seqs, min=1, max=128, description="slots"),
            "num_blocks": W.IntSlider(value=num_blocks, min=16, max=4096, step=16, description="KV blocks"),
            "prompt_len": W.IntSlider(value=prompt_len, min=8, max=1024, description="prompt tokens"),
            "output_len": W.IntSlider(value=output_len, min=1, max=512, description="output tokens"),
            "chunk": W.IntSlider(value=chunk, min=0, max=512, step=16, description="chunk (0: off)"),
            "prefix_share": W.FloatSlider(value=prefix_share, min=0, max=1, step=0.1, description="shared prefix"),
            "guesses": W.IntSlider(value=guesses, min=0, max=8, description="guesses k (0: off)"),
            "acceptance": W.FloatSlider(value=acceptance, min=0, max=1, step=0.05, description="guess acceptance"),
            "spread": W.Dropdown(value=spread, options=SPREADS, description="lengths"),
        }
        for slider in self.sliders.values():
            slider.continuous_update = False
            slider.style = {"description_width": "135px"}
            slider.observe(self._changed, names="value")
        self.status, self.picture, self.readout = W.HTML(), W.HTML(), W.HTML()
        self.simulated = 0  # redraws finished (a coalesced one that was overtaken does not count)
        self._svg, self._words = "", ""  # the last finished redraw's picture and readout
        self._wanted = 0  # bumped by every change; a redraw whose number is overtaken stops
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        controls = list(self.sliders.values())
        super().__init__([W.HBox([W.VBox(controls[:5]), W.VBox(controls[5:])]),
                          self.status, self.picture, self.readout])
        self.redraw()  # at once, in this thread: the saved notebook shows the first picture

    def settings(self) -> dict:
        return {name: slider.value for name, slider in self.sliders.items()}

    def _changed(self, change: object = None) -> None:
        if not self.background:
            self.redraw()
            return
        with self._lock:
            self._wanted += 1
            self._show_busy("simulating… the picture and numbers below are still the previous settings'")
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True)
                self._worker.start()

    def _work(self) -> None:
        """The helper thread: redraw the latest settings until no newer change came meanwhile."""
        while True:
            with self._lock:
                wanted = self._wanted
            try:
                self.redraw(stale=lambda wanted=wanted: self._wanted != wanted)
            except Exception as err:  # noqa: BLE001 — said in the widget, not lost in a thread
                self.status.value = f'<p style="color:#d62728">the simulation failed: {type(err).__name__}: {err}</p>'
            with self._lock:
                if self._wanted == wanted:
                    self._worker = None
                    return

    def settle(self, timeout: float = 120.0) -> None:
        """Wait until the redraws in progress are done (tests; a notebook never needs to)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def _show_busy(self, words: str) -> None:
        self.status.value = f'<p style="color:#666"><i>{words}</i></p>'
        if self._svg:
            self.picture.value, self.readout.value = GREYED.format(self._svg), GREYED.format(self._words)

    def redraw(self, stale: Callable[[], bool] = lambda: False) -> bool:
        """Simulate the sliders' settings and draw them: the chosen rate first, then the sweep. Returns
        False, leaving the picture as it was, when `stale()` says newer settings came meanwhile."""
        s = self.settings()
        count = requests_per_point(s["output_len"])
        order = [SWEEP.index(1.0)] + [i for i in range(len(SWEEP)) if SWEEP[i] != 1.0]
        points: list[dict | None] = [None] * len(SWEEP)
        for done, i in enumerate(order):
            if stale():
                return False
            if self._svg and self.background and done:
                self._show_busy(f"simulating… rate {done + 1} of {len(SWEEP)} (200 requests each, fewer when outputs "
                                "are long); the picture and numbers below are still the previous settings'")
            points[i] = run_point(self.step_time, s["rate"] * SWEEP[i], s["max_num_seqs"], s["num_blocks"],
                                  s["prompt_len"], s["output_len"], s["chunk"], s["prefix_share"], count=count,
                                  guesses=s["guesses"], acceptance=s["acceptance"], spread=s["spread"])
        if stale():
            return False
        chosen = points[SWEEP.index(1.0)]
        self._svg = render(points, chosen)
        self._words = readout(chosen, s["num_blocks"], capacity=capacity(self.step_time, s["max_num_seqs"],
                                                                          s["prompt_len"], s["output_len"]))
        self.picture.value, self.readout.value, self.status.value = self._svg, self._words, ""
        self.simulated += 1
        return True


def _ms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "—"
    if seconds >= 1.0:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def readout(chosen: dict, num_blocks: int, block_size: int = 16, capacity: float | None = None) -> str:
    """The chosen rate's numbers in words; what could not be served said first; with `capacity`, the
    rate set beside what the engine finishes with every slot busy."""
    lines = []
    if chosen["refused"]:
        lines.append(f"<b>{chosen['refused']} of {chosen['count']} requests can never fit in {num_blocks} KV blocks "
                     f"({num_blocks * block_size:,} tokens): the engine refuses them.</b> ")
        if not chosen["requests"]:
            lines.append("Nothing runs, so no other setting changes the picture: give it more KV blocks. ")
    if chosen["requests"]:
        lines.append(f"At {chosen['rate']:.3g} requests/s: {chosen['output_token_throughput']:.0f} output tokens/s; "
                     f"TTFT p50 {_ms(chosen['ttft_p50_s'])}, p99 {_ms(chosen['ttft_p99_s'])}; "
                     f"TPOT p50 {_ms(chosen['tpot_p50_s'])}; ITL p99 {_ms(chosen['itl_p99_s'])}; "
                     f"longest step {_ms(chosen['longest_step_s'])}; {chosen['preemptions']} preemptions "
                     f"({chosen['requests']} simulated requests served).")
    if capacity is not None and chosen["requests"]:
        lines.append(f" Every slot busy, this engine finishes about {capacity:.3g} requests/s (plain decoding, no "
                     "prefix hits, KV never short: <code>capacity()</code>): the chosen rate is "
                     f"{chosen['rate'] / capacity:.2f} of it.")
    return "<p>" + "".join(lines) + "</p>"
