"""Latency metrics of one request, and their aggregation over many.

    arrival ──queue──► first token ──ITL──► token 2 ──ITL──► ... ──► last token
    |◄──────── TTFT ────────►|◄──────── (n - 1) × TPOT ────────────────►|

TTFT: time to first token (queueing + prefill; the first token comes from the prefill's logits).
ITL:  inter-token latency, the gap between consecutive tokens of one request.
TPOT: time per output token after the first, the mean ITL: (last - first) / (n - 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Timestamps (seconds, `time.perf_counter()`) of one request."""

    arrival_time: float
    token_times: list[float] = field(default_factory=list)  # when each output token was produced
    finish_time: float | None = None

    def record_token(self, now: float) -> None:
        self.token_times.append(now)

    @property
    def num_tokens(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    def as_dict(self) -> dict:
        return {"ttft_s": self.ttft, "tpot_s": self.tpot, "latency_s": self.latency,
                "num_output_tokens": self.num_tokens, "itls_s": self.itls}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values) if values else math.nan,
            "p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99)}


def summarize(requests: Iterable[RequestMetrics], wall_time: float | None = None) -> dict:
    """TTFT / TPOT / ITL distributions and throughput over finished requests.

    Throughput is output tokens per second of `wall_time` (default: first arrival to last finish).
    """
    reqs = list(requests)
    ttfts = [r.ttft for r in reqs if r.ttft is not None]
    tpots = [r.tpot for r in reqs if r.tpot is not None]
    itls = [x for r in reqs for x in r.itls]
    tokens = sum(r.num_tokens for r in reqs)
    if wall_time is None:
        finishes = [r.finish_time for r in reqs if r.finish_time is not None]
        wall_time = max(finishes) - min(r.arrival_time for r in reqs) if finishes else math.nan
    return {
        "num_requests": len(reqs),
        "output_tokens": tokens,
        "wall_time_s": wall_time,
        "output_tokens_per_s": tokens / wall_time if wall_time and wall_time > 0 else math.nan,
        "ttft_s": distribution(ttfts),
        "tpot_s": distribution(tpots),
        "itl_s": distribution(itls),
    }
