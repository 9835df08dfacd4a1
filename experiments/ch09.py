"""Chapter 9's live experiments, against a running OpenAI-compatible server: a streamed request timed
from the client, and Poisson load at a light and a heavy rate — run in turns, round by round, with
the server's /metrics read every 50 ms meanwhile (Little's law's L). The server's CPU time counts as
ours (it is this kernel's child, or `include`d); other programs' CPU time is the guard's business."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from experiments import Finding
from minillm.loadgen import RequestRecord, Slo, run_load, summarize
from minillm.timing import interleaved

RERUN_LOAD = "the load cell of section 2 (the Little's law cell after it reads the same runs)"


def run_async(coro: Coroutine) -> Any:
    """`coro`'s result, run by `asyncio.run` in a helper thread — a notebook's kernel already runs an
    event loop in this one. The stop button (KeyboardInterrupt) cancels it."""
    outcome: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> Any:
        outcome["loop"], outcome["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await coro

    def thread_main() -> None:
        try:
            outcome["value"] = asyncio.run(main())  # closes the loop cleanly: pending streams, generators
        except BaseException as err:  # noqa: BLE001 — handed back to the caller's thread
            outcome["error"] = err
        finally:
            started.set()

    thread = threading.Thread(target=thread_main, daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)  # short waits: an interrupt reaches this thread at once
    except KeyboardInterrupt:
        started.wait(10)
        if "task" in outcome:
            outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
        thread.join(10)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# ----------------------------------------------------------------------------- a streamed request


@dataclass
class Stream:
    """One streamed completion, as the client saw it: each text piece's arrival (seconds after sending)."""

    text: str
    arrivals: list[float]

    @property
    def ttft(self) -> float:
        return self.arrivals[0]

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


def stream_once(client, model: str, prompt: str, max_tokens: int) -> Stream:
    """`prompt` streamed through the `openai` client, greedy, each piece's arrival timed."""
    start, arrivals, text = time.perf_counter(), [], ""
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True):
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter() - start)
            text += chunk.choices[0].text
    return Stream(text, arrivals)


def streaming_timing(client, model: str, prompt: str = "ROMEO:", max_tokens: int = 24, repeats: int = 3,
                     include: Sequence[int] = ()) -> Finding:
    """The same greedy request streamed `repeats` times. numbers: the quickest TTFT (the least
    disturbed stream), the median gap over every stream (an ITL), the pieces, the last stream."""
    trials = interleaved({"stream": lambda: stream_once(client, model, prompt, max_tokens)}, repeats,
                         rerun="this cell", include=include)
    streams = trials.results["stream"]
    ttft = trials.best("stream", lambda s: s.ttft)
    gap = statistics.median(g for s in streams for g in s.gaps) if any(s.gaps for s in streams) else 0.0
    same = all(s.text == streams[0].text for s in streams)
    holds = same and ttft > gap
    pieces = len(streams[-1].arrivals)
    text = (f"Streamed {pieces} pieces of text, {repeats} times: the first arrived after {ttft * 1e3:.0f} ms (the "
            f"quickest of the {repeats}: the TTFT as the client sees it), then one every {gap * 1e3:.1f} ms (the "
            "median gap: an ITL; a request's mean gap is its TPOT). ")
    if ttft > gap:
        text += (f"The first token took {ttft / gap:.1f} gaps' time: it carries the request's way in (HTTP, checking, "
                 "tokenizing, the queue) and the prefill; each later one only a decode step and its way out.")
    else:
        text += ("Here the first token came no later than a typical gap: the prompt is a few tokens, so its prefill "
                 "costs about a decode step, and the way in was quick this time.")
    if not same:
        text += " The streams' texts differed, which greedy decoding should never do: look at the server's log."
    return Finding(text, holds, {"ttft_s": ttft, "gap_s": gap, "pieces": pieces, "stream": streams[-1]}, trials)


# ----------------------------------------------------------------------------- load at two rates


@dataclass
class LoadRun:
    """One Poisson load run: the client's records, and how many requests the server held meanwhile."""

    rate: float
    records: list[RequestRecord]
    wall: float
    inside: list[int] = field(default_factory=list)  # running + waiting, from /metrics every 50 ms
    waiting: list[int] = field(default_factory=list)
    slo: Slo = field(default_factory=lambda: Slo(ttft_s=0.5, tpot_s=0.05))

    @property
    def summary(self) -> dict:
        return summarize(self.records, self.wall, self.slo)

    @property
    def met(self) -> int:
        return sum(self.slo.met(r) for r in self.records)

    @property
    def ttft_p50(self) -> float:
        return self.summary["ttft_s"]["p50"] or float("inf")

    @property
    def little(self) -> tuple[float, float, float] | None:
        """(lambda: requests finished per second, W: their mean latency, L: requests inside on average
        from /metrics), or None when nothing finished or nothing was sampled."""
        latency = [r.chunk_times[-1] - r.sent for r in self.records if r.ok and r.chunk_times]
        if not latency or not self.inside:
            return None
        return len(latency) / self.wall, sum(latency) / len(latency), sum(self.inside) / len(self.inside)


def _metrics(url: str) -> dict[str, float]:
    """The server's /metrics text (Prometheus' format: one 'name value' per line) as numbers."""
    text = httpx.get(url + "/metrics", timeout=2).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")}


def load_run(url: str, model: str, prompts: list[str], rate: float, max_tokens: int = 64, seed: int = 0,
             slo: Slo | None = None) -> LoadRun:
    """`prompts` sent at seeded Poisson times, `rate` per second, each streaming exactly `max_tokens`
    tokens; meanwhile a thread reads the server's /metrics every 50 ms."""
    run = LoadRun(rate, [], 0.0, slo=slo or Slo(ttft_s=0.5, tpot_s=0.05))
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            try:
                values = _metrics(url)
            except (httpx.HTTPError, IndexError, ValueError):
                continue  # a sample missed; the next comes 50 ms later
            run.inside.append(int(values["minillm_requests_running"] + values["minillm_requests_waiting"]))
            run.waiting.append(int(values["minillm_requests_waiting"]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run.records, run.wall = run_async(run_load(url + "/v1", model, prompts, rate, max_tokens, seed=seed,
                                                   extra={"ignore_eos": True}, progress=False))
    finally:
        done.set()
        sampler.join()
    return run


def load_at_two_rates(url: str, model: str, prompts: list[str], light: float = 4.0, heavy: float = 24.0,
                      rounds: int = 2, max_tokens: int = 64, slo: Slo | None = None,
                      include: Sequence[int] = ()) -> Finding:
    """The same prompts at `light` and at `heavy` requests per second, `rounds` times each, in turns.
    numbers: "light"/"heavy" (every LoadRun), the median of the rounds' TTFT p50 and output
    throughput per rate, the per-round ratios heavy/light, the words' verdicts."""
    slo = slo or Slo(ttft_s=0.5, tpot_s=0.05)
    trials = interleaved({"light": lambda: load_run(url, model, prompts, light, max_tokens, slo=slo),
                          "heavy": lambda: load_run(url, model, prompts, heavy, max_tokens, slo=slo)},
                         rounds, rerun=RERUN_LOAD, include=include)
    ttft = lambda run: run.ttft_p50  # noqa: E731
    tokens = lambda run: run.summary["output_token_throughput"]  # noqa: E731
    numbers = {"light": trials.results["light"], "heavy": trials.results["heavy"], "rates": (light, heavy),
               "ttft_light_s": trials.median("light", ttft), "ttft_heavy_s": trials.median("heavy", ttft),
               "tokens_light": trials.median("light", tokens), "tokens_heavy": trials.median("heavy", tokens),
               "finished_heavy": trials.median("heavy", lambda run: run.summary["request_throughput"]),
               "tpot_light_s": trials.median("light", lambda run: run.summary["tpot_s"]["p50"] or float("inf")),
               "met_light": trials.values("light", lambda run: run.met),  # per round
               "met_heavy": trials.values("heavy", lambda run: run.met),
               "goodput_light": trials.median("light", lambda run: run.summary["goodput"]),
               "goodput_heavy": trials.median("heavy", lambda run: run.summary["goodput"]),
               "requests": len(prompts), "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "rounds": rounds}
    queueing = trials.ratio("heavy", "light", ttft, what="TTFT p50")
    throughput = trials.ratio("heavy", "light", tokens, what="output throughput")
    numbers |= {"queueing": queueing.value, "queueing_rounds": queueing.per_round, "queueing_agrees": queueing.agrees,
                "throughput_gain": throughput.value, "throughput_rounds": throughput.per_round}
    text, holds = describe_load(numbers)
    return Finding(text, holds, numbers, trials)


def describe_load(n: dict) -> tuple[str, bool]:
    """The words for a light and a heavy load run (numbers as load_at_two_rates gives them), and
    whether they showed the chapter's claim: the light rate kept up, the heavy one queued."""
    light, heavy = n["rates"]
    ms = lambda s: f"{s * 1e3:,.0f} ms"  # noqa: E731
    met = lambda key: " and ".join(f"{m:g}" for m in n[key]) + f" of {n['requests']}"  # noqa: E731
    kept_up = n["ttft_light_s"] <= n["slo_ttft_s"] and min(n["met_light"]) >= 0.8 * n["requests"]
    queued = n["ttft_heavy_s"] > n["slo_ttft_s"] and n["queueing"] > 2 and n["queueing_agrees"]
    rounds = ", ".join(f"{r:.1f}x" for r in n["queueing_rounds"])
    each = f"the median of {n['rounds']} rounds" if n["rounds"] > 1 else "one round"
    if kept_up:
        text = (f"At {light:g} requests/s the server kept up: TTFT p50 {ms(n['ttft_light_s'])} ({each}), about a "
                f"prefill and the request's way in, and {met('met_light')} requests met the SLO. ")
    else:
        text = (f"Even at {light:g} requests/s the server fell behind here: TTFT p50 {ms(n['ttft_light_s'])} and TPOT "
                f"p50 {ms(n['tpot_light_s'])} ({each}), and only {met('met_light')} requests met "
                f"the SLO (TTFT <= {ms(n['slo_ttft_s'])}, TPOT <= {ms(n['slo_tpot_s'])}): this machine is slower than "
                "the course's, or busy. ")
    if queued:
        text += (f"At {heavy:g} requests/s it could not keep up: it finished {n['finished_heavy']:.1f} requests/s, the "
                 f"rest queued, and TTFT p50 was {ms(n['ttft_heavy_s'])}, {n['queueing']:.1f}x the light rate's (the "
                 f"median of per-round ratios {rounds}). ")
    elif n["ttft_heavy_s"] <= n["slo_ttft_s"]:
        text += (f"Even at {heavy:g} requests/s it kept up (TTFT p50 {ms(n['ttft_heavy_s'])}): this machine serves "
                 f"{n['requests']} short requests faster than the course's; raise the heavy rate to see a queue. ")
    elif not n["queueing_agrees"]:
        text += (f"At {heavy:g} requests/s TTFT p50 was {ms(n['ttft_heavy_s'])}, but the rounds do not agree on "
                 f"whether that is slower than the light rate (ratios {rounds}): too noisy to say more. ")
    else:
        text += (f"At {heavy:g} requests/s TTFT p50 was {ms(n['ttft_heavy_s'])}, only {n['queueing']:.1f}x the light "
                 f"rate's (ratios {rounds}): requests queued at both rates here, so the heavy one adds less than on a "
                 "machine where the light rate keeps up. ")
    rose = "rose" if n["throughput_gain"] > 1 else "did not rise"
    text += (f"Output throughput {rose} ({n['tokens_light']:.0f} to {n['tokens_heavy']:.0f} tokens/s, "
             f"{n['throughput_gain']:.1f}x: fuller batches use the machine better), while {met('met_heavy')} "
             f"requests met the SLO at the heavy rate: goodput {n['goodput_heavy']:.1f} requests/s "
             f"against {n['goodput_light']:.1f} at the light one.")
    return text, kept_up and queued


def little_rows(finding: Finding) -> list[tuple[float, int, tuple[float, float, float]]]:
    """(rate, round, (lambda, W, L)) for every load run of `finding` that finished something."""
    return [(run.rate, i + 1, run.little) for key in ("light", "heavy")
            for i, run in enumerate(finding.numbers[key]) if run.little is not None]


def little_words(rows: list[tuple[float, int, tuple[float, float, float]]]) -> str:
    """How closely lambda x W matched the L read from /metrics, in every run."""
    if not rows:
        return "No run finished a request, so there is nothing to compare: rerun the load cell."
    off = [abs(lam * w - inside) / max(inside, 1e-9) for _, _, (lam, w, inside) in rows]
    worst = max(off)
    if worst <= 0.15:
        return (f"In every run λ·W and the L read from /metrics agree within {worst:.0%}: a server's concurrency, "
                "throughput and latency are not three free numbers. To serve twice the rate at the same latency, it "
                "must hold twice the requests at once — slots and KV memory (chapters 3-5) are what Little's law "
                "spends.")
    return (f"Here λ·W and L differ by up to {worst:.0%} in one run: /metrics is sampled every 50 ms, and a short run "
            "on a busy machine leaves few samples, or misses the moments when the queue peaked. The law itself holds "
            "for any run that starts and ends empty; rerun the load cell on a quiet machine to see them agree.")
