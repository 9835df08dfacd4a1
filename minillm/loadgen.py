"""A load generator for any OpenAI-compatible server (chapter 9): `python -m minillm bench`.

    arrivals:  seeded Poisson at --rate requests/s (or all at once: --rate inf); an arrival later than
               --duration seconds after the start is not sent, so a rate ends within duration + request timeout
    requests:  streaming POST /v1/completions, prompts cut from a text (the course's held-out sample
               by default), --max-tokens each
    measured:  per request its send time, each streamed chunk's arrival, its output tokens (counted from
               the stream, checked against the server's `usage`); then TTFT, TPOT, ITL (p50 / p90 / p99),
               request and output-token throughput, and goodput: requests per second that met the SLO
               (TTFT and TPOT both under their limits)

Because it speaks only the public API, the same run can drive minillm, vLLM or SGLang. ITL here is
the gap between streamed chunks: a server that sends several tokens in one chunk (speculative
decoding, or a detokenizer holding back half a character) shows one gap for them.

How output tokens are counted. The stream is the evidence: every chunk that carries text is at least
one token, so the chunks with text are a lower bound, and `usage.completion_tokens` (asked for with
`stream_options: {"include_usage": true}`, as vLLM's own benchmark counts) is taken when it is
plausible and consistent with them — an integer from the chunks' count up to max_tokens (a chunk may
hold several tokens' text). A server that sends no usage gets its chunks counted. A usage below the
chunks' count is a disagreement: the record keeps a warning naming both numbers and the counted one is
used. A usage that is not an integer, negative or over max_tokens (or more chunks with text than
max_tokens) is absurd: the request fails with that reason.

A request succeeded when its stream carried at least one chunk of text (or none, but a choice
finished with "stop" or "length" and a usage of at least one token: a model may end at once, on
EOS), ended with `data: [DONE]` and carried no error (an `error` object, or a choice finished with
"error"); anything else is its failure, with the reason. Every read is bounded: a stream line over
MAX_LINE_BYTES or an error body over MAX_ERROR_BODY_BYTES fails the request and closes its
connection, and a request still running `request_timeout` seconds after it was sent fails however
slowly its bytes keep dribbling in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minillm.metrics import percentile

MAX_LINE_BYTES = 1 << 20  # one server-sent-event line: a chunk of a few tokens is well under a kilobyte
MAX_ERROR_BODY_BYTES = 64 << 10  # an HTTP error's body: its first 300 characters are shown
MAX_PROMPTS_FILE_BYTES = 64 << 20  # --prompts-file: prompts are cut from it, it is not a corpus


@dataclass
class RequestRecord:
    sent: float  # seconds since the run began (planned, until it is sent)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with text
    output_tokens: int = 0  # see the module's docstring: usage when plausible and consistent, else the chunks
    status: int | None = None
    error: str | None = None  # why the request failed
    done: bool = False  # the stream ended with data: [DONE]
    usage_tokens: int | None = None  # the server's usage.completion_tokens, when it sent one
    warning: str | None = None  # the server's usage disagreed with the stream (the counted number is used)
    not_sent: bool = False  # its arrival fell after the run's duration
    finish_reason: str | None = None  # as the stream's last choice gave it

    @property
    def ok(self) -> bool:
        said_something = bool(self.chunk_times) or (self.finish_reason in ("stop", "length") and self.output_tokens)
        return self.status == 200 and self.error is None and self.done and said_something

    @property
    def ttft(self) -> float | None:  # None: no token arrived
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


def read_prompts_file(path: str | Path, max_bytes: int = MAX_PROMPTS_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`. A FIFO, a device or a folder is refused
    before anything is read (it is opened without blocking, then checked): reading one may never end."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (a FIFO, a device or a folder could block or never end)")
        if info.st_size > max_bytes:
            raise ValueError(f"{info.st_size:,} bytes; at most {max_bytes:,} are read")
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"it grew past {max_bytes:,} bytes while it was read")
    return data.decode("utf-8")


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


_END_OF_LINE = re.compile(rb"\r\n|\r|\n")  # SSE allows all three


async def bounded_lines(chunks: AsyncIterator[bytes], max_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[str]:
    """The lines of a byte stream, decoded as UTF-8; a line longer than `max_bytes` raises ValueError
    as soon as that many bytes of it have arrived (nothing past one line and one chunk is held)."""
    buffer, scanned = bytearray(), 0  # buffer[:scanned] holds no end of line
    async for chunk in chunks:
        buffer += chunk
        start = 0
        while (match := _END_OF_LINE.search(buffer, max(start, scanned))) is not None:
            if match.group() == b"\r" and match.end() == len(buffer):
                break  # a \r at the end: its \n may come in the next chunk
            if match.start() - start > max_bytes:
                break
            yield buffer[start : match.start()].decode("utf-8", errors="replace")
            start = match.end()
        del buffer[:start]
        scanned = len(buffer) - int(buffer.endswith(b"\r"))
        if scanned > max_bytes:
            raise ValueError(f"a line of the stream is longer than {max_bytes:,} bytes; the rest was not read")
    if buffer:
        yield buffer.removesuffix(b"\r").decode("utf-8", errors="replace")  # the last line, without an end of line


def _usage_tokens(usage: object, max_tokens: int) -> int | None:
    """The server's completion_tokens if it sent any; ValueError if they are absurd."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ValueError(f"the server's usage is not an object: {json.dumps(usage)[:80]}")
    tokens = usage.get("completion_tokens")
    if tokens is None:
        return None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= max_tokens:
        raise ValueError(f"the server's usage.completion_tokens is absurd: {json.dumps(tokens)[:40]} (an integer "
                         f"from 0 to max_tokens = {max_tokens} was expected)")
    return tokens


def read_event(data: str, record: RequestRecord, now: float, max_tokens: int) -> None:
    """One server-sent event's data: a chunk of text, the usage, or an error — into `record`."""
    try:
        event = json.loads(data)
    except ValueError:
        raise ValueError(f"not JSON in the stream: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise ValueError(f"a stream event that is not an object: {data[:80]!r}")
    if event.get("error") is not None:
        raise ValueError(f"the server reported an error mid-stream: {json.dumps(event['error'])[:200]}")
    tokens = _usage_tokens(event.get("usage"), max_tokens)
    if tokens is not None:
        record.usage_tokens = tokens
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ValueError(f"malformed choices in the stream: {data[:80]!r}")
    if any(c.get("finish_reason") == "error" for c in choices):
        raise ValueError("the server ended the request with finish_reason 'error'")
    record.finish_reason = next((c["finish_reason"] for c in choices if isinstance(c.get("finish_reason"), str)),
                                record.finish_reason)
    if any(isinstance(c.get("text"), str) and c["text"] for c in choices):
        if len(record.chunk_times) == max_tokens:
            raise ValueError(f"the stream carried more chunks of text than max_tokens = {max_tokens}")
        record.chunk_times.append(now)


def count_tokens(record: RequestRecord) -> None:
    """A finished stream's output tokens (see the module's docstring); no chunk of text and no finished
    choice is a failure."""
    counted, usage = len(record.chunk_times), record.usage_tokens
    if counted == 0 and record.finish_reason in ("stop", "length") and usage:
        record.output_tokens = usage  # a model may end at once (EOS first): a finished answer without text
    elif counted == 0:
        said = "" if usage is None else f" (its usage says {usage} completion tokens)"
        record.error = f"no output token: the stream carried no text{said}"
    elif usage is None:
        record.output_tokens = counted  # no usage sent: one token per chunk with text
    elif usage < counted:
        record.output_tokens = counted
        record.warning = (f"the server's usage says {usage} completion tokens but its stream carried {counted} "
                          f"chunks of text; counted {counted}")
    else:
        record.output_tokens = usage  # a chunk may carry several tokens' text


async def _error_body(response, encoding: str) -> str:
    """`HTTP status: the body's start`, reading at most MAX_ERROR_BODY_BYTES of it."""
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > MAX_ERROR_BODY_BYTES:
            break
    text = body.decode(errors="replace")[:300] if encoding == "identity" else f"(a body in {encoding})"
    cut = f" (the error body is over {MAX_ERROR_BODY_BYTES:,} bytes; the rest was not read)" \
        if len(body) > MAX_ERROR_BODY_BYTES else ""
    return f"HTTP {response.status_code}: {text}{cut}"


async def _one(client, url: str, body: dict, record: RequestRecord, start: float, headers: dict) -> None:
    max_tokens = body["max_tokens"]
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            record.status = response.status_code
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if response.status_code != 200:
                record.error = await _error_body(response, encoding)
                return
            if encoding != "identity":
                record.error = f"a compressed stream (content-encoding {encoding!r}) though none was asked for"
                return
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                record.error = (f"not a stream (content-type {response.headers.get('content-type')!r}): does the "
                                "server support stream: true?")
                return
            async with contextlib.aclosing(bounded_lines(response.aiter_raw())) as lines:
                async for line in lines:
                    if not line.startswith("data:"):
                        continue  # comments, event names, blank lines between events
                    data = line[5:].removeprefix(" ")  # SSE allows "data:x" and "data: x"
                    if data == "[DONE]":
                        record.done = True
                        break
                    read_event(data, record, time.perf_counter() - start, max_tokens)
        if not record.done:
            record.error = "the stream ended without data: [DONE]"
        else:
            count_tokens(record)
    except Exception as err:  # a refused connection, a timeout, a broken stream: this request's failure, not the run's
        record.error = _describe(err)


async def run_load(base_url: str, model: str, prompts: list[str], rate: float, max_tokens: int, seed: int = 0,
                   api_key: str | None = None, extra: dict | None = None, progress: bool = True,
                   request_timeout: float = 600.0, duration: float | None = None) -> tuple[list, float]:
    """Send every prompt at its arrival time, streaming; returns (records, wall seconds). A request
    that has not finished `request_timeout` seconds after it was sent fails (TimeoutError); a prompt
    whose arrival is later than `duration` seconds (default: `request_timeout`) is not sent (its record
    says `not_sent`), so the run ends within duration + request_timeout whatever the rate."""
    import httpx
    from tqdm.auto import tqdm

    url = base_url.rstrip("/") + "/completions"
    headers = {"Accept-Encoding": "identity"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    deadline = request_timeout if duration is None else duration
    times = arrival_times(len(prompts), rate, seed)
    records = [RequestRecord(sent=t, not_sent=t > deadline) for t in times]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout), limits=limits) as client:
        start = time.perf_counter()
        bar = tqdm(total=sum(not r.not_sent for r in records), desc=f"rate {rate:g}/s", unit="req",
                   disable=not progress)

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

        await asyncio.gather(*(send(p, r) for p, r in zip(prompts, records) if not r.not_sent))
        bar.close()
        return records, time.perf_counter() - start


def summarize(records: list[RequestRecord], wall: float, slo: Slo) -> dict:
    """TTFT / TPOT / ITL percentiles (seconds), throughput and goodput over the run. `requests` counts
    those sent (`not_sent`: those whose arrival fell after the run's duration); `errors` lists the
    failures' reasons first, then the usage disagreements, five at most."""
    sent = [r for r in records if not r.not_sent]
    ok = [r for r in sent if r.ok]
    errors = sorted({r.error for r in sent if r.error}) + sorted({r.warning for r in ok if r.warning})

    def spread(values: list[float]) -> dict[str, float | None]:
        return {f"p{q}": percentile(values, q) if values else None for q in (50, 90, 99)}

    return {"requests": len(sent), "not_sent": len(records) - len(sent), "completed": len(ok),
            "failed": len(sent) - len(ok), "wall_s": wall,
            "request_throughput": len(ok) / wall, "output_token_throughput": sum(r.output_tokens for r in ok) / wall,
            "goodput": sum(slo.met(r) for r in ok) / wall, "slo": asdict(slo),
            "ttft_s": spread([r.ttft for r in ok if r.ttft is not None]),
            "tpot_s": spread([r.tpot for r in ok if r.tpot is not None]),
            "itl_s": spread([gap for r in ok for gap in r.itls]),
            "errors": errors[:5]}


def sweep(base_url: str, model: str, rates: list[float], num_prompts: int, max_tokens: int, seed: int, slo: Slo,
          text: str, api_key: str | None = None, extra: dict | None = None, progress: bool = True,
          request_timeout: float = 600.0, on_rate: Callable[[list[dict]], None] | None = None,
          duration: float | None = None) -> list[dict]:
    """One run per rate (the same seeded prompts each time, `duration` as in `run_load`); one summary
    per rate. `on_rate` gets the summaries so far after each rate (to save them: an interrupted sweep
    keeps what it finished)."""
    prompts = prompts_from_text(text, num_prompts, seed)
    results = []
    for rate in rates:
        records, wall = asyncio.run(run_load(base_url, model, prompts, rate, max_tokens, seed, api_key, extra,
                                             progress, request_timeout, duration))
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
