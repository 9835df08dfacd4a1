"""Chapter 9's live experiments, against a running OpenAI-compatible server: the server itself (started
in its own process, its log in the repository's logs/ folder), a streamed request timed from the
client, and Poisson load at a light and a heavy rate — run in turns, round by round, with the
server's /metrics read every 50 ms meanwhile (Little's law's L). The server's CPU time counts as
ours (it is this kernel's child, or `include`d); other programs' CPU time is the guard's business."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from experiments import Finding
from minillm.loadgen import RequestRecord, Slo, run_load, summarize
from minillm.timing import CpuWatch, interleaved, torch_threads

REPO = Path(__file__).resolve().parents[1]
SERVER_LOG = REPO / "logs" / "chapter09-server.log"  # git-ignored; JupyterLab's file browser shows it
RERUN_LOAD = "the load cell of section 5 (the Little's law cell after it reads the same runs)"


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


# ----------------------------------------------------------------------------- the server


@dataclass
class Server:
    """The chapter's server: `python -m minillm serve` in its own process (its own session, so that
    the notebook's stop button interrupts the kernel, not the server), answering at `url`."""

    process: subprocess.Popen
    url: str
    log: Path
    stopped: bool = False  # by stop(): the notebook's last cell, or the first cell run again

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """None while the server runs, else its exit code (as `subprocess.Popen.poll`)."""
        return self.process.poll()

    def why_not(self) -> str | None:
        """None while the server runs; else one line: why it does not, and what to rerun."""
        code = self.poll()
        if code is None:
            return None
        if self.stopped:
            return ("The server was stopped by the last cell: rerun the cell that starts it (the first code cell), "
                    "then this one.")
        return (f"The server exited by itself (exit code {code}); its log is {shown(self.log)}. Rerun the first code "
                "cell to start it again, then this one.")

    def ready(self) -> bool:
        """True while the server runs; else print why_not() (one line, no traceback) and return False."""
        problem = self.why_not()
        if problem is not None:
            print(problem)
        return problem is None

    def stop(self) -> None:
        """Stop the server (if it still runs) and wait for it to exit."""
        self.stopped = True
        if self.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def shown(path: Path) -> str:
    """`path` as the learner finds it in JupyterLab's file browser: relative to the repository."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(flags: Sequence[str] = (), log: Path = SERVER_LOG, timeout_s: float = 120.0,
                 command: Callable[[int], list[str]] | None = None) -> Server:
    """`python -m minillm serve` on a free port with `flags` (or `command(port)`), its output written
    to `log` (overwritten at each start); returns once it answers GET /health. Stopped when the
    kernel stops, at the latest."""
    port = free_port()
    argv = command(port) if command else [sys.executable, "-m", "minillm", "serve", "--port", str(port), *flags]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:  # the child keeps its own handle
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    atexit.register(server.stop)  # never leave it running behind the kernel
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited while starting (exit code {process.returncode}); its log, "
                               f"{shown(log)}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"the server did not answer within {timeout_s:g} s; its log, {shown(log)}:\n"
                       f"{log.read_text()[-4000:]}")


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
    numbers: "light"/"heavy" (every LoadRun), per rate the median of the rounds' TTFT p50, TPOT p50
    and output throughput and each round's own, the per-round ratios heavy/light, the runs in which
    not every request completed ("incomplete": rate, round, completed, why), the words' verdicts."""
    slo = slo or Slo(ttft_s=0.5, tpot_s=0.05)
    trials = interleaved({"light": lambda: load_run(url, model, prompts, light, max_tokens, slo=slo),
                          "heavy": lambda: load_run(url, model, prompts, heavy, max_tokens, slo=slo)},
                         rounds, rerun=RERUN_LOAD, include=include)
    ttft = lambda run: run.ttft_p50  # noqa: E731
    tpot = lambda run: run.summary["tpot_s"]["p50"] or float("inf")  # noqa: E731
    tokens = lambda run: run.summary["output_token_throughput"]  # noqa: E731
    goodput = lambda run: run.summary["goodput"]  # noqa: E731
    numbers = {"light": trials.results["light"], "heavy": trials.results["heavy"], "rates": (light, heavy),
               "requests": len(prompts), "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "rounds": rounds,
               "incomplete": [(run.rate, i + 1, run.summary["completed"], failure(run.summary["errors"]))
                              for key in ("light", "heavy") for i, run in enumerate(trials.results[key])
                              if run.summary["completed"] < len(prompts)]}
    for key in ("light", "heavy"):
        numbers |= {f"ttft_{key}_s": trials.median(key, ttft), f"tpot_{key}_s": trials.median(key, tpot),
                    f"tokens_{key}": trials.median(key, tokens), f"goodput_{key}": trials.median(key, goodput),
                    f"met_{key}": trials.values(key, lambda run: run.met),  # per round, as the next three
                    f"goodput_{key}_rounds": trials.values(key, goodput),
                    f"ttft_{key}_rounds": trials.values(key, ttft), f"tpot_{key}_rounds": trials.values(key, tpot)}
    numbers["finished_heavy"] = trials.median("heavy", lambda run: run.summary["request_throughput"])
    if any(completed == 0 for _, _, completed, _ in numbers["incomplete"]):
        text, _ = describe_load(numbers)  # nothing to compare: no ratios for the guard to check
        return Finding(text, False, numbers, trials)
    queueing = trials.ratio("heavy", "light", ttft, what="TTFT p50")
    throughput = trials.ratio("heavy", "light", tokens, what="output throughput")
    per_token = trials.ratio("heavy", "light", tpot, what="TPOT p50")
    numbers |= {"queueing": queueing.value, "queueing_rounds": queueing.per_round, "queueing_agrees": queueing.agrees,
                "throughput_gain": throughput.value, "throughput_rounds": throughput.per_round,
                "tpot_growth": per_token.value, "tpot_rounds": per_token.per_round}
    text, holds = describe_load(numbers)
    return Finding(text, holds, numbers, trials)


def failure(errors: Sequence[str]) -> str:
    """Why a run's requests failed, in a few words: the load generator's first error, or "connection
    refused" when nothing answered at the server's address."""
    if not errors:
        return "no error reported"
    if any(e.startswith("ConnectError") or "onnection refused" in e or "connection attempts failed" in e
           for e in errors):
        return "connection refused"
    return errors[0][:160]


def trend(per_round: Sequence[float]) -> str:
    """'up' when every round's ratio is above 1 (a tie counts with either side), 'down' when every
    one is below, 'same' when all are 1, else 'mixed' (the rounds disagree)."""
    if all(r == 1 for r in per_round):
        return "same"
    if all(r >= 1 for r in per_round):
        return "up"
    if all(r <= 1 for r in per_round):
        return "down"
    return "mixed"


def _ratios(per_round: Sequence[float]) -> str:
    return ", ".join(f"{r:.2f}x" for r in per_round)


def _split(per_round: Sequence[float], up: str, down: str) -> str:
    """'rose in round 1 (1.46x) and fell in round 2 (0.93x)': each round's direction, in order."""
    rounds = lambda picked: " and ".join(str(i + 1) for i in picked)  # noqa: E731
    ups = [i for i, r in enumerate(per_round) if r > 1]
    downs = [i for i, r in enumerate(per_round) if r < 1]
    shown = lambda picked: ", ".join(f"{per_round[i]:.2f}x" for i in picked)  # noqa: E731
    return (f"{up} in round{'s' * (len(ups) > 1)} {rounds(ups)} ({shown(ups)}) and {down} in "
            f"round{'s' * (len(downs) > 1)} {rounds(downs)} ({shown(downs)})")


def describe_load(n: dict) -> tuple[str, bool]:
    """The words for a light and a heavy load run (numbers as load_at_two_rates gives them), and
    whether they showed the chapter's claim: the light rate kept up, the heavy one queued. Each
    comparison follows every round: where the rounds disagree, the words say so."""
    light, heavy = n["rates"]
    ms = lambda s: f"{s * 1e3:,.0f} ms" if math.isfinite(s) else "none"  # noqa: E731
    met = lambda key: " and ".join(f"{m:g}" for m in n[key]) + f" of {n['requests']}"  # noqa: E731
    incomplete = n.get("incomplete", [])
    lost = "; ".join(f"{completed} of {n['requests']} completed at {rate:g} requests/s in round {i}: {why}"
                     for rate, i, completed, why in incomplete)
    if any(completed == 0 for _, _, completed, _ in incomplete):
        advice = (" (nothing answered at the server's address: rerun the first code cell to start the server, then "
                  "this one)" if any(why == "connection refused" for *_, why in incomplete) else "")
        return f"{lost}{advice}. With no request completed there is nothing to measure.", False
    text = (f"Not every request completed: {lost}. The numbers count the completed ones only. " if incomplete
            else "")
    kept_up = n["ttft_light_s"] <= n["slo_ttft_s"] and min(n["met_light"]) >= 0.8 * n["requests"]
    queued = n["ttft_heavy_s"] > n["slo_ttft_s"] and n["queueing"] > 2 and n["queueing_agrees"]
    rounds = ", ".join(f"{r:.1f}x" for r in n["queueing_rounds"])
    several = n["rounds"] > 1
    each = f"the median of {n['rounds']} rounds" if several else "one round"
    every = "every round" if several else "its one round"
    if kept_up:
        text += (f"At {light:g} requests/s the server kept up: TTFT p50 {ms(n['ttft_light_s'])} ({each}), about a "
                 f"prefill and the request's way in, and {met('met_light')} requests met the SLO. ")
    else:
        text += (f"Even at {light:g} requests/s the server fell behind here: TTFT p50 {ms(n['ttft_light_s'])} and "
                 f"TPOT p50 {ms(n['tpot_light_s'])} ({each}), and only {met('met_light')} requests met "
                 f"the SLO (TTFT <= {ms(n['slo_ttft_s'])}, TPOT <= {ms(n['slo_tpot_s'])}): this machine is slower "
                 "than the course's, or busy. ")
    if queued:
        text += (f"At {heavy:g} requests/s it could not keep up: it finished {n['finished_heavy']:.1f} requests/s, the "
                 f"rest queued, and TTFT p50 was {ms(n['ttft_heavy_s'])}, {n['queueing']:.1f}x the light rate's (the "
                 f"median of per-round ratios {rounds}). ")
    elif n["ttft_heavy_s"] <= n["slo_ttft_s"] and n["finished_heavy"] >= 0.8 * heavy \
            and min(n["met_heavy"]) >= 0.8 * n["requests"]:
        text += (f"Even at {heavy:g} requests/s it kept up (TTFT p50 {ms(n['ttft_heavy_s'])}, "
                 f"{n['finished_heavy']:.1f} requests/s finished, {met('met_heavy')} met the SLO): this machine serves "
                 f"{n['requests']} short requests faster than the one the course was run on; raise the heavy rate to "
                 "see a queue. ")
    elif n["ttft_heavy_s"] <= n["slo_ttft_s"]:
        text += (f"At {heavy:g} requests/s a queue formed, though the median hides it: TTFT p50 stayed at "
                 f"{ms(n['ttft_heavy_s'])}, but the server finished {n['finished_heavy']:.1f} requests/s of the "
                 f"{heavy:g} offered and only {met('met_heavy')} requests met the SLO. With {n['requests']} requests "
                 "the queue never grows long: the first ones in found free slots, the rest waited. ")
    elif not n["queueing_agrees"]:
        text += (f"At {heavy:g} requests/s TTFT p50 was {ms(n['ttft_heavy_s'])}, but the rounds do not agree on "
                 f"whether that is slower than the light rate (ratios {rounds}): too noisy to say more. ")
    else:
        text += (f"At {heavy:g} requests/s TTFT p50 was {ms(n['ttft_heavy_s'])}, only {n['queueing']:.1f}x the light "
                 f"rate's (the median of per-round ratios {rounds}): requests queued at both rates here, so the heavy "
                 "one adds less than on a machine where the light rate keeps up. ")
    tokens = f"{n['tokens_light']:.0f} to {n['tokens_heavy']:.0f} tokens/s, the medians"
    way = trend(n["throughput_rounds"])
    if way == "up":
        text += (f"Output throughput rose in {every} ({tokens}; heavy / light {_ratios(n['throughput_rounds'])}): "
                 "fuller batches use the machine better. ")
    elif way == "mixed":
        text += (f"Output throughput {_split(n['throughput_rounds'], 'rose', 'fell')} ({tokens}): the rounds "
                 "disagree, so these runs cannot say whether fuller batches helped. ")
    else:
        text += (f"Output throughput did not rise ({tokens}; heavy / light {_ratios(n['throughput_rounds'])}): "
                 "fuller batches bought nothing in these runs (both rates kept the batch full, or other programs "
                 "took the cores). ")
    per_token = f"{ms(n['tpot_light_s'])} to {ms(n['tpot_heavy_s'])}, the medians"
    way = trend(n["tpot_rounds"])
    if way == "up":
        text += (f"TPOT p50 grew in {every} ({per_token}; heavy / light {_ratios(n['tpot_rounds'])}): a step that "
                 "carries more requests takes longer, and every request waits for it. ")
    elif way == "mixed":
        text += (f"TPOT p50 {_split(n['tpot_rounds'], 'grew', 'fell')} ({per_token}): the rounds disagree, so "
                 "these runs cannot say what fuller batches cost each token. ")
    else:
        text += (f"TPOT p50 did not grow ({per_token}; heavy / light {_ratios(n['tpot_rounds'])}): the batch's size "
                 "did not decide the steps' time in these runs (both rates kept the batch full, or other programs' "
                 "interruptions outweighed it). ")
    goodput = lambda key: " and ".join(f"{g:.1f}" for g in n[f"goodput_{key}_rounds"])  # noqa: E731
    text += (f"At the heavy rate {met('met_heavy')} requests met the SLO (goodput {goodput('heavy')} requests/s), "
             f"against {met('met_light')} at the light one ({goodput('light')} requests/s).")
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


# ----------------------------------------------------------------------------- lm-eval-harness through the server

EVALS = REPO / "evals"
TARGET = REPO / "minillm" / "assets" / "target"  # the checkpoint the server serves by default
EVAL_LOG = REPO / "logs" / "chapter09-lm-eval.log"  # lm-eval's own messages and progress bars, not the notebook's
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# the course's two tasks (evals/README.md) and the metrics each reports, as lm-eval names them
EVAL_METRICS = {"minillm_arith_mc": ("acc,none", "acc_norm,none"), "minillm_arith_gen": ("exact_match,strip",)}


def eval_task(name: str) -> dict:
    """evals/<name>.yaml as an lm-eval task config, its data_files made absolute: lm-eval opens them
    relative to the working directory, which in a notebook is chapters/, not the repository."""
    import yaml

    config = yaml.safe_load((EVALS / f"{name}.yaml").read_text())
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {split: str(REPO / path) for split, path in files.items()}
    return config


@contextlib.contextmanager
def _into(log: Path):
    """Everything printed meanwhile — by Python or by a child process (lm-eval asks git for its
    version) — goes to `log` instead of the notebook: lm-eval's info lines and progress bars."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                yield
        finally:
            out.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


@contextlib.contextmanager
def _no_progress_bars():
    """Hugging Face's progress bars (transformers loading weights, datasets preparing a split) are
    notebook widgets in a kernel, which no redirect of the output catches: off meanwhile."""
    import datasets
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    toggles = [(not hub.are_progress_bars_disabled(), hub.disable_progress_bars, hub.enable_progress_bars),
               (datasets.is_progress_bar_enabled(), datasets.disable_progress_bars, datasets.enable_progress_bars),
               (transformers_logging.is_progress_bar_enabled(), transformers_logging.disable_progress_bar,
                transformers_logging.enable_progress_bar)]
    for _, off, _ in toggles:
        off()
    try:
        yield
    finally:
        for was_on, _, on in toggles:
            if was_on:
                on()


def lm_evaluate(model: str, model_args: dict, limit: int | None = None, log: Path = EVAL_LOG) -> dict:
    """`lm_eval.simple_evaluate` on the course's two tasks (evals/), offline, one request at a time,
    the first `limit` questions of each (None: all 40); its messages appended to `log`."""
    for name, value in OFFLINE.items():  # local files only: nothing is looked up on the Hugging Face hub
        os.environ[name] = value
    import lm_eval
    from lm_eval.tasks import TaskManager

    with _into(log), _no_progress_bars():
        print(f"\n===== lm_eval.simple_evaluate(model={model!r}, model_args={model_args}, limit={limit})", flush=True)
        return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[eval_task(t) for t in EVAL_METRICS],
                                       task_manager=TaskManager(include_defaults=False), batch_size=1, limit=limit,
                                       log_samples=True)


def served_model_args(url: str, model: str, max_model_len: int) -> dict:
    """lm-eval's `local-completions` pointed at our server. It sends token ids, cut by the served
    checkpoint's own tokenizer (tokenized_requests), so both backends score the very same tokens."""
    return {"model": model, "base_url": url + "/v1/completions", "tokenizer": str(TARGET),
            "tokenizer_backend": "huggingface", "tokenized_requests": True, "num_concurrent": 1, "max_retries": 1,
            "max_length": max_model_len}


HF_MODEL_ARGS = {"pretrained": str(TARGET), "dtype": "float32", "device": "cpu"}  # transformers, in this process


def scores(results: dict) -> dict[tuple[str, str], float]:
    """{(task, metric): value} from simple_evaluate's results."""
    return {(task, metric): float(results["results"][task][metric]) for task, metrics in EVAL_METRICS.items()
            for metric in metrics}


def per_question(served: dict, hf: dict) -> dict[str, dict]:
    """For each task: how many questions both backends answered alike ("same", of "questions") and,
    for the multiple-choice task, the largest gap between two log-likelihoods of one choice."""
    out = {}
    for task in EVAL_METRICS:
        ours = sorted(served["samples"][task], key=lambda s: s["doc_id"])
        theirs = sorted(hf["samples"][task], key=lambda s: s["doc_id"])
        if task == "minillm_arith_mc":  # filtered_resps: one (log-likelihood, is greedy) per choice
            same = sum(a["acc"] == b["acc"] and a["acc_norm"] == b["acc_norm"] for a, b in zip(ours, theirs))
            gap = max((abs(x[0] - y[0]) for a, b in zip(ours, theirs)
                       for x, y in zip(a["filtered_resps"], b["filtered_resps"])), default=0.0)
            out[task] = {"same": same, "questions": len(ours), "loglikelihood_gap": gap}
        else:
            same = sum(a["filtered_resps"] == b["filtered_resps"] for a, b in zip(ours, theirs))
            out[task] = {"same": same, "questions": len(ours)}
    return out


def lm_eval_side_by_side(url: str, model: str, max_model_len: int, limit: int | None = None,
                         log: Path = EVAL_LOG, include: Sequence[int] = ()) -> Finding:
    """The course's tasks run by lm-eval twice on the served checkpoint: `local-completions` against
    the server at `url`, then `hf` (transformers in this process), a progress line saying which runs.
    numbers: "served" and "hf" (their scores), "per_question" (per_question()), "seconds" of each
    run, "limit", "log", "busy" (what other programs did meanwhile, when they took our cores; the
    server's process, `include`d, counts as ours). On a busy machine transformers runs with the
    threads that fit beside the other work."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")  # a fresh log per run
    with CpuWatch(include) as glance:
        time.sleep(0.25)
    assert glance.use is not None
    threads = min(torch.get_num_threads(), glance.use.free_cores) if glance.use.busy else torch.get_num_threads()
    seconds = {}
    with torch_threads(threads), CpuWatch(include) as watch:  # transformers' threads beside the other work
        print(f"\r{'lm-eval, 1 of 2: the two tasks through the server ...':<96}", end="", flush=True)
        start = time.perf_counter()
        served = lm_evaluate("local-completions", served_model_args(url, model, max_model_len), limit, log)
        seconds["served"] = time.perf_counter() - start
        print(f"\r{'lm-eval, 2 of 2: the same with transformers in this process ...':<96}", end="", flush=True)
        start = time.perf_counter()
        hf = lm_evaluate("hf", HF_MODEL_ARGS, limit, log)
        seconds["hf"] = time.perf_counter() - start
    print(f"\r{f'lm-eval ran twice in {sum(seconds.values()):.0f} s':<96}", flush=True)  # the progress line, ended
    assert watch.use is not None
    numbers = {"served": scores(served), "hf": scores(hf), "per_question": per_question(served, hf),
               "seconds": seconds, "limit": limit, "log": log,
               "busy": watch.use.describe() if watch.use.busy else None}
    text, holds = describe_eval(numbers)
    return Finding(text, holds, numbers)


def describe_eval(n: dict) -> tuple[str, bool]:
    """The words for lm_eval_side_by_side's numbers, and whether the two backends agreed everywhere."""
    equal = n["served"] == n["hf"]
    alike = all(q["same"] == q["questions"] for q in n["per_question"].values())
    answered = ", ".join(f"{q['same']} of {q['questions']} ({task})" for task, q in n["per_question"].items())
    gap = n["per_question"]["minillm_arith_mc"]["loglikelihood_gap"]
    if equal and alike:
        text = (f"The two backends gave equal scores on every metric, and the same answer to every question: "
                f"{answered}. The log-likelihoods of the choices differ by at most {gap:.1e}: our model and "
                "transformers compute the same logits up to rounding, on the same token ids.")
    elif equal:
        text = (f"The scores are equal, but not every answer: {answered} questions answered alike (log-likelihoods "
                f"up to {gap:.1e} apart), the differences cancelling out in the mean. Compare the two runs question "
                "by question in lm-eval's samples.")
    else:
        differ = "; ".join(f"{task} {metric.split(',')[0]}: {n['hf'][task, metric]:.3f} with hf, "
                           f"{n['served'][task, metric]:.3f} through the server"
                           for task, metric in n["hf"] if n["hf"][task, metric] != n["served"][task, metric])
        text = (f"The scores differ ({differ}); questions answered alike: {answered}; log-likelihoods up to "
                f"{gap:.1e} apart. The server and transformers did not score the same tokens the same way: lm-eval's "
                f"messages are in {shown(n['log'])}.")
    return text, equal and alike
