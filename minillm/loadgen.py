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
decoding, or a detokenizer holding back half a character) shows one gap for them. A server that
ignores `stream_options` sends no `usage`: its tokens are then counted as its chunks with text.

A request succeeded when its stream ended with `data: [DONE]` and carried no error (an `error`
object, or a choice finished with "error"); anything else is its failure, with the reason.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minillm.metrics import percentile


@dataclass
class RequestRecord:
    sent: float  # seconds since the run began
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with text
    output_tokens: int = 0  # the server's usage.completion_tokens, else the chunks with text
    status: int | None = None
    error: str | None = None
    done: bool = False  # the stream ended with data: [DONE]

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.done

    @property
    def ttft(self) -> float | None:  # None: the server finished without a token (a stop at once)
        return self.chunk_times[0] - self.sent if self.chunk_times else None

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
        return (record.ok and (record.ttft is None or record.ttft <= self.ttft_s)
                and (record.tpot is None or record.tpot <= self.tpot_s))


def prompts_from_text(text: str, count: int, seed: int, min_chars: int = 64, max_chars: int = 512) -> list[str]:
    """`count` passages of the text, of random lengths and starts (seeded). The text must hold several
    of the longest (else every prompt would be much the same, which a prefix cache would flatter)."""
    if len(text) < 4 * max_chars:
        raise ValueError(f"the prompts' text has {len(text):,} characters; it needs at least {4 * max_chars:,} "
                         "to cut varied prompts from")
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


def _describe(err: BaseException) -> str:
    """One line for a request's failure: the innermost cause, not a wrapper's name."""
    while isinstance(getattr(err, "exceptions", None), (list, tuple)) and err.exceptions:  # an exception group
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def read_event(data: str, record: RequestRecord, now: float) -> None:
    """One server-sent event's data: a chunk of text, the usage, or an error — into `record`."""
    try:
        event = json.loads(data)
    except ValueError:
        raise ValueError(f"not JSON in the stream: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise ValueError(f"a stream event that is not an object: {data[:80]!r}")
    if event.get("error") is not None:
        raise ValueError(f"the server reported an error mid-stream: {json.dumps(event['error'])[:200]}")
    usage = event.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        record.output_tokens = usage["completion_tokens"]
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ValueError(f"malformed choices in the stream: {data[:80]!r}")
    if any(c.get("finish_reason") == "error" for c in choices):
        raise ValueError("the server ended the request with finish_reason 'error'")
    if any(isinstance(c.get("text"), str) and c["text"] for c in choices):
        record.chunk_times.append(now)


async def _one(client, url: str, body: dict, record: RequestRecord, start: float, headers: dict) -> None:
    usage_seen = False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:300]}"
                return
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                record.error = (f"not a stream (content-type {response.headers.get('content-type')!r}): does the "
                                "server support stream: true?")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # comments, event names, blank lines between events
                data = line[5:].removeprefix(" ")  # SSE allows "data:x" and "data: x"
                if data == "[DONE]":
                    record.done = True
                    break
                tokens = record.output_tokens
                read_event(data, record, time.perf_counter() - start)
                usage_seen |= record.output_tokens != tokens
        if not record.done:
            record.error = "the stream ended without data: [DONE]"
        elif not usage_seen:
            record.output_tokens = len(record.chunk_times)  # no usage sent: one token per chunk with text
    except Exception as err:  # a refused connection, a timeout, a broken stream: this request's failure, not the run's
        record.error = _describe(err)


async def run_load(base_url: str, model: str, prompts: list[str], rate: float, max_tokens: int, seed: int = 0,
                   api_key: str | None = None, extra: dict | None = None, progress: bool = True,
                   request_timeout: float = 600.0) -> tuple[list, float]:
    """Send every prompt at its arrival time, streaming; returns (records, wall seconds). A request
    that has not finished `request_timeout` seconds after it was sent fails (TimeoutError)."""
    import httpx
    from tqdm.auto import tqdm

    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    times = arrival_times(len(prompts), rate, seed)
    records = [RequestRecord(sent=t) for t in times]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout), limits=limits) as client:
        start = time.perf_counter()
        bar = tqdm(total=len(prompts), desc=f"rate {rate:g}/s", unit="req", disable=not progress)

        async def send(prompt: str, record: RequestRecord) -> None:
            await asyncio.sleep(max(0.0, record.sent - (time.perf_counter() - start)))
            record.sent = time.perf_counter() - start  # when it really left
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}} | (extra or {})
            try:
                await asyncio.wait_for(_one(client, url, body, record, start, headers), request_timeout)
            except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
                record.error = f"TimeoutError: no end after {request_timeout:g} s"
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
            "ttft_s": spread([r.ttft for r in ok if r.ttft is not None]),
            "tpot_s": spread([r.tpot for r in ok if r.tpot is not None]),
            "itl_s": spread([gap for r in ok for gap in r.itls]),
            "errors": sorted({r.error for r in records if r.error})[:5]}


def sweep(base_url: str, model: str, rates: list[float], num_prompts: int, max_tokens: int, seed: int, slo: Slo,
          text: str, api_key: str | None = None, extra: dict | None = None, progress: bool = True,
          request_timeout: float = 600.0, on_rate: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """One run per rate (the same seeded prompts each time); one summary per rate. `on_rate` gets the
    summaries so far after each rate (to save them: an interrupted sweep keeps what it finished)."""
    prompts = prompts_from_text(text, num_prompts, seed)
    results = []
    for rate in rates:
        records, wall = asyncio.run(run_load(base_url, model, prompts, rate, max_tokens, seed, api_key, extra,
                                             progress, request_timeout))
        results.append({"rate": rate} | summarize(records, wall, slo))
        if on_rate is not None:
            on_rate(results)
    return results


def plot(results: list[dict], path: Path) -> None:
    """Throughput against latency, one point per rate: where the curve bends upward is the server's capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [r["output_token_throughput"] for r in results]
    for ax, key, label in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        shown = [(xi, r) for xi, r in zip(x, results) if r[key]["p99"] is not None]  # a rate that all failed: none
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot([xi for xi, _ in shown], [1e3 * r[key][q] for _, r in shown], style, label=f"{label} {q}")
        for xi, r in shown:
            ax.annotate(f"{r['rate']:g}/s", (xi, 1e3 * r[key]["p99"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.set(xlabel="output tokens / s", ylabel=f"{label} (ms)", ylim=(0, None),
               title=f"{label} against throughput, per arrival rate")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
