"""`GET /metrics`: the server's state and history in Prometheus' text format (chapter 9).

    minillm_requests_running 3                      gauges read from the engine now
    minillm_kv_blocks_used 41
    minillm_requests_total{finish_reason="stop"} 120    counters since the server started
    minillm_time_to_first_token_seconds_bucket{le="0.1"} 87     histograms of finished requests
    ...

Gauges are a snapshot read between the engine's steps without waiting for one to end (each number
is current; together they may straddle a step). Counters and histograms are recorded by the server
as it answers each request.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from minillm.engine import RequestOutput

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds


@dataclass
class Histogram:
    """Prometheus-style: cumulative counts per upper bound, their sum and count."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))  # the last one: +Inf
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{"+Inf" if bound == float("inf") else bound}"}} {running}')
        return out + [f"{name}_sum {self.total:.6f}", f"{name}_count {running}"]


@dataclass
class ServerMetrics:
    """What the server has answered, request by request."""

    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    latency: Histogram = field(default_factory=Histogram)

    def count_abort(self) -> None:
        """A request whose client left before its output came back."""
        self.finished["abort"] = self.finished.get("abort", 0) + 1

    def record(self, out: RequestOutput) -> None:
        self.finished[out.finish_reason] = self.finished.get(out.finish_reason, 0) + 1
        self.prompt_tokens += len(out.prompt_token_ids)
        self.generated_tokens += sum(len(o.token_ids) for o in out.outputs)  # every sample's (n > 1)
        m = out.metrics
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        for gap in m.itls:
            self.itl.observe(gap)
        if m.latency is not None:
            self.latency.observe(m.latency)

    def render(self, gauges: dict[str, float]) -> str:
        """The Prometheus text exposition of the engine's state now (`LLMEngine.gauges()`) and the server's
        history."""
        lines = []
        for name, value in gauges.items():
            kind = "counter" if name == "preemptions" or name.endswith("_tokens") else "gauge"
            lines += [f"# TYPE minillm_{name}{'_total' if kind == 'counter' else ''} {kind}",
                      f"minillm_{name}{'_total' if kind == 'counter' else ''} {value}"]
        lines.append("# TYPE minillm_requests_total counter")
        lines += [f'minillm_requests_total{{finish_reason="{reason}"}} {n}'
                  for reason, n in sorted(self.finished.items())]
        lines += ["# TYPE minillm_prompt_tokens_total counter", f"minillm_prompt_tokens_total {self.prompt_tokens}",
                  "# TYPE minillm_generation_tokens_total counter",
                  f"minillm_generation_tokens_total {self.generated_tokens}"]
        for name, histogram in (("time_to_first_token_seconds", self.ttft), ("inter_token_latency_seconds", self.itl),
                                ("request_latency_seconds", self.latency)):
            lines += [f"# TYPE minillm_{name} histogram", *histogram.lines(f"minillm_{name}")]
        return "\n".join(lines) + "\n"
