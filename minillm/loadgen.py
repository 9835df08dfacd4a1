"""A load generator for any OpenAI-compatible server (chapter 9): `python -m minillm bench`.

    arrivals:  seeded Poisson at --rate requests/s (or all at once: --rate inf)
    requests:  streaming POST /v1/completions, prompts cut from a text (the course's held-out sample
               by default), --max-tokens each
    measured:  per request its send time, each streamed chunk's arrival, its output tokens (the
               server's `usage`); then TTFT, TPOT, ITL (p50 / p90 / p99), request and output-token
               throughput, and goodput: requests per second that met the SLO (TTFT and TPOT both under
               their limits)

Because it speaks only the public API, the same run can drive minillm, vLLM or SGLang. ITL here is
the gap between streamed chunks: a server that sends several tokens in one chunk (speculative
decoding, or a detokenizer holding back half a character) shows one gap for them.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minillm.metrics import percentile


@dataclass
class RequestRecord:
    sent: float  # seconds since the run began
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with text
    output_tokens: int = 0
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 1.0
    tpot_s: float = 0.1

    def met(self, record: RequestRecord) -> bool:
        return record.ok and record.ttft <= self.ttft_s and (record.tpot is None or record.tpot <= self.tpot_s)


def prompts_from_text(text: str, count: int, seed: int, min_chars: int = 64, max_chars: int = 512) -> list[str]:
    """`count` passages of the text, of random lengths and starts (seeded)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        length = rng.randint(min_chars, max_chars)
        start = rng.randrange(max(1, len(text) - length))
        out.append(text[start : start + length])
    return out


def arrival_times(count: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent: Poisson arrivals at `rate` per second
    (exponential gaps), or all at 0 for an infinite rate."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


async def _one(client, url: str, body: dict, record: RequestRecord, start: float, headers: dict) -> None:
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.error = (await response.aread()).decode(errors="replace")[:300]
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("usage"):
                    record.output_tokens = data["usage"]["completion_tokens"]
                if any(choice.get("text") for choice in data.get("choices", [])):
                    record.chunk_times.append(time.perf_counter() - start)
    except Exception as err:  # a refused connection, a timeout: this request's failure, not the run's
        record.error = f"{type(err).__name__}: {err}"


async def run_load(base_url: str, model: str, prompts: list[str], rate: float, max_tokens: int, seed: int = 0,
                   api_key: str | None = None, extra: dict | None = None, progress: bool = True) -> tuple[list, float]:
    """Send every prompt at its arrival time, streaming; returns (records, wall seconds)."""
    import httpx
    from tqdm.auto import tqdm

    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    times = arrival_times(len(prompts), rate, seed)
    records = [RequestRecord(sent=t) for t in times]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        bar = tqdm(total=len(prompts), desc=f"rate {rate:g}/s", unit="req", disable=not progress)

        async def send(prompt: str, record: RequestRecord) -> None:
            await asyncio.sleep(max(0.0, record.sent - (time.perf_counter() - start)))
            record.sent = time.perf_counter() - start  # when it really left
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}} | (extra or {})
            await _one(client, url, body, record, start, headers)
            bar.update()

        await asyncio.gather(*(send(p, r) for p, r in zip(prompts, records)))
        bar.close()
        return records, time.perf_counter() - start


def summarize(records: list[RequestRecord], wall: float, slo: Slo) -> dict:
    """TTFT / TPOT / ITL percentiles (seconds), throughput and goodput over the run."""
    ok = [r for r in records if r.ok]

    def spread(values: list[float]) -> dict[str, float | None]:
        return {f"p{q}": percentile(values, q) if values else None for q in (50, 90, 99)}

    return {"requests": len(records), "completed": len(ok), "failed": len(records) - len(ok), "wall_s": wall,
            "request_throughput": len(ok) / wall, "output_token_throughput": sum(r.output_tokens for r in ok) / wall,
            "goodput": sum(slo.met(r) for r in ok) / wall, "slo": asdict(slo),
            "ttft_s": spread([r.ttft for r in ok]), "tpot_s": spread([r.tpot for r in ok if r.tpot is not None]),
            "itl_s": spread([gap for r in ok for gap in r.itls]),
            "errors": sorted({r.error for r in records if r.error})[:5]}


def sweep(base_url: str, model: str, rates: list[float], num_prompts: int, max_tokens: int, seed: int, slo: Slo,
          text: str, api_key: str | None = None, extra: dict | None = None, progress: bool = True) -> list[dict]:
    """One run per rate (the same seeded prompts each time); one summary per rate."""
    prompts = prompts_from_text(text, num_prompts, seed)
    results = []
    for rate in rates:
        records, wall = asyncio.run(run_load(base_url, model, prompts, rate, max_tokens, seed, api_key, extra,
                                             progress))
        results.append({"rate": rate} | summarize(records, wall, slo))
    return results


def plot(results: list[dict], path: Path) -> None:
    """Throughput against latency, one point per rate: where the curve bends upward is the server's capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [r["output_token_throughput"] for r in results]
    for ax, key, label in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(x, [1e3 * (r[key][q] or 0) for r in results], style, label=f"{label} {q}")
        for r, xi in zip(results, x):
            ax.annotate(f"{r['rate']:g}/s", (xi, 1e3 * (r[key]["p99"] or 0)), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.set(xlabel="output tokens / s", ylabel=f"{label} (ms)", ylim=(0, None),
               title=f"{label} against throughput, per arrival rate")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
