"""Chapter 10's experiments: a real run recorded span by span, the engine in the server's process and
in a process of its own, and what the front end costs per token.

    record              one short run through AsyncLLM (the engine on this process's event loop, as
                        `serve --engine-core thread` runs it) or ProcessAsyncLLM (the engine core in a
                        process of its own, as `serve` runs it), with every span of both sides recorded
                        (minillm/timeline.py); each streamed event is turned into the
                        server's SSE line, as its route does, so the front end does a server's work
    save / load         recordings as JSON: chapters/data/core_timeline.json is the course's, recorded
                        by `python -m experiments.ch10` on a quiet machine
    gil_beside_the_step the same decode steps alone, beside a busy thread of this process, and beside a
                        busy process: interleaved rounds, with the busy-machine guard
    versus_vllm         the saved benchmark (benchmarks/serve_vs_vllm.py, benchmarks/async_overhead.py): its
                        tables, its plot, and words computed from whatever numbers it holds

What a recording can say is computed from its spans (`minillm/timeline.py::Recording`):
the share of the run each kind of work took, and how long the model's forward pass ran while the front
end worked.
"""

from __future__ import annotations

import asyncio
import json
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import torch

import minillm
from experiments import Finding
from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.loadgen import prompts_from_text
from minillm.sampling import SamplingParams
from minillm.server.responses import chunk
from minillm.timeline import FRONT_END_KINDS, Recording, Timeline
from minillm.timing import CpuWatch, PairedRatio, Trials, interleaved, torch_threads

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
RECORDING = REPO / "chapters" / "data" / "core_timeline.json"  # the course's saved recording
MODES = {"thread": "before: the engine in the server's process (AsyncLLM)",
         "process": "after: the engine core in a process of its own (ProcessAsyncLLM)"}
STOP = "THE END"  # every request's stop string: searched for at every token, never found in these texts


def workload(num_requests: int = 16, max_tokens: int = 32, seed: int = 0) -> tuple[list[str], SamplingParams]:
    """The recorded run's requests: passages of the held-out text, each for exactly `max_tokens` greedy tokens
    with a stop string to look for (as a chat request carries its stop strings)."""
    text = (minillm.ASSETS_DIR / "heldout_sample.txt").read_text()
    prompts = prompts_from_text(text, num_requests, seed=seed, min_chars=96, max_chars=192)
    return prompts, SamplingParams(temperature=0, max_new_tokens=max_tokens, ignore_eos=True, stop=[STOP])


async def _serve(llm: AsyncLLM, prompts: Sequence[str], params: SamplingParams, timeline: Timeline | None) -> int:
    """Every prompt streamed at once; each event with text becomes the server's SSE line. Returns the tokens."""

    async def one(i: int, prompt: str) -> int:
        async for event in llm.stream_events(prompt, params):
            if event.output is not None:
                return len(event.output.token_ids)
            if event.delta or event.finish_reason:  # what minillm/server/streaming.py::sse does with it
                start = time.perf_counter()
                body = chunk(f"cmpl-{i}", "minillm-target", False, event.delta, event.finish_reason)
                f"data: {json.dumps(body)}\n\n".encode()
                if timeline is not None:
                    timeline.add("send to client", start, time.perf_counter())
        return 0

    return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def engine_config(slots: int) -> EngineConfig:
    """What `python -m minillm serve --max-num-seqs SLOTS` serves (its defaults: the paged cache...)."""
    return EngineConfig(max_num_seqs=slots, kv="paged", max_model_len=512, trace_max_steps=64)


async def record(mode: str, num_requests: int = 16, max_tokens: int = 32, slots: int = 16,
                 llm: AsyncLLM | None = None, threads: int | None = None) -> Recording:
    """One recorded run (`mode`: "thread" or "process"), after one unrecorded warm-up run of the same requests.
    Pass `llm` to reuse one made with a timeline (`make_llm`); else one is made (its torch computing with
    `threads`, default: as many as torch has) and closed here. The machine's CPU use is watched meanwhile:
    `info["busy"]` says what other programs did, when they kept cores the run needed."""
    own = llm is None
    threads = threads or torch.get_num_threads()
    llm = llm if llm is not None else make_llm(mode, slots, threads)
    core = [llm.core_pid] if getattr(llm, "core_pid", None) else []  # the core process's CPU is the run's own
    try:
        prompts, params = workload(num_requests, max_tokens)
        with torch_threads(threads):
            await _serve(llm, prompts, params, None)  # warm-up: the first steps of a fresh engine are slower
            llm.timeline.drain()
            with CpuWatch(core) as watch:
                start = time.perf_counter()
                tokens = await _serve(llm, prompts, params, llm.timeline)
                end = time.perf_counter()
        await asyncio.sleep(0.05)  # the core's last spans arrive with its last step
        spans = llm.timeline.drain()
    finally:
        if own and mode == "process":
            llm.close()
    steps = sum(1 for s in spans if s.kind == "schedule" and start <= s.start < end)  # one per engine step
    use = watch.use
    busy = {"busy": use.describe()} if use is not None and use.busy else {}
    return Recording.of(MODES[mode], spans, start, end, tokens, mode=mode, requests=num_requests,
                        max_tokens=max_tokens, slots=slots, steps=steps, torch_threads=threads,
                        machine=f"{platform.machine()}, {psutil.cpu_count()} cores", **busy)


async def record_both(num_requests: int = 16, max_tokens: int = 32, slots: int = 16) -> list[Recording]:
    """Both runs recorded live, before (thread) and after (process). On a machine already busy, torch
    computes with as many threads as the other programs left cores free (a thread waiting for a busy
    core stalls every operator of the others), and a line says so before anything runs."""
    with CpuWatch() as glance:
        time.sleep(0.25)
    threads = torch.get_num_threads()
    if glance.use is not None and glance.use.busy:
        threads = min(threads, glance.use.free_cores)
        print(f"⚠ Before recording: {glance.use.describe()}. Both runs will be disturbed, the timeline will show "
              f"it as longer pieces, and torch computes with {threads} thread{'s' * (threads != 1)}.", flush=True)
    recordings = [await record(mode, num_requests, max_tokens, slots, threads=threads)
                  for mode in ("thread", "process")]
    if glance.use is not None and glance.use.busy:  # with fewer threads the runs may not see it: they still shared
        for recording in recordings:
            recording.info["busy"] = recording.info.get("busy") or f"before it, {glance.use.describe()}"
    return recordings


def make_llm(mode: str, slots: int = 16, threads: int | None = None) -> AsyncLLM:
    if mode == "thread":
        return AsyncLLM(config=engine_config(slots), timeline=Timeline("server"))
    if mode == "process":
        from minillm.engine_core import ProcessAsyncLLM

        return ProcessAsyncLLM(config=engine_config(slots), threads=threads, timeline=Timeline("front end"))
    raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")


def save(recordings: Sequence[Recording], path: Path = RECORDING) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"recordings": [r.to_dict() for r in recordings]}, separators=(",", ":")) + "\n")


def load(path: Path = RECORDING) -> list[Recording]:
    return [Recording.from_dict(r) for r in json.loads(path.read_text())["recordings"]]


def compare_rows(recordings: Sequence[Recording]) -> list[list[str]]:
    """Per recording: wall time, tok/s, the forward's share and time, the front end's work and how much of it ran
    beside a forward, the core's sending."""
    rows = []
    for rec in recordings:
        front = rec.busy_ms(FRONT_END_KINDS)
        rows.append([rec.label.split(":")[0], f"{rec.wall_ms:.0f} ms", f"{rec.tokens / rec.wall_ms * 1e3:,.0f}",
                     f"{rec.busy_ms(['forward']) / rec.wall_ms:.0%}", f"{rec.busy_ms(['forward']):.0f} ms",
                     f"{front:.1f} ms", f"{rec.overlap_ms(FRONT_END_KINDS, ['forward']) / front if front else 0:.0%}",
                     f"{rec.busy_ms(['send']):.1f} ms"])
    return rows


def compare_words(before: Recording, after: Recording) -> str:
    """What the two recordings show, in words computed from them, whichever way they came out — and no
    verdict when other programs were busy during either run."""
    busy = [f"{r.info['mode']} run: {r.info['busy']}" for r in (before, after) if r.info.get("busy")]
    speed = before.wall_ms / after.wall_ms
    stretch = after.busy_ms(["forward"]) / before.busy_ms(["forward"])
    front = max(after.busy_ms(FRONT_END_KINDS), 1e-9)
    beside = after.overlap_ms(FRONT_END_KINDS, ["forward"]) / front
    during_send = after.overlap_ms(FRONT_END_KINDS, ["send"]) / front
    pace = (f"{speed:.2f}x as fast" if speed > 1.03 else "about as fast" if speed > 0.97 else
            f"{1 / speed:.2f}x as slow")
    words = [f"The split run took {after.wall_ms:.0f} ms against {before.wall_ms:.0f} ms: {pace}."]
    words.append(f"{beside:.0%} of the front end's work ran beside a forward pass, instead of between two.")
    if during_send > 0.3:
        words.append(f"{during_send:.0%} of it ran while the core was sending a step: the two processes took turns "
                     "on a core more than they worked side by side (the core's torch threads ask for every core).")
    if stretch > 1.05:
        words.append(f"The forward passes took {stretch:.2f}x as long in all: the front end's process ran on cores the "
                     "forward computes on.")
    else:
        words.append(f"The forward passes took {stretch:.2f}x their time in the first run.")
    send = after.busy_ms(["send"]) / max(after.info.get("steps", 1), 1)
    if busy:
        words.insert(0, f"⚠ Other programs were busy while this recorded ({'; '.join(busy)}): the times below "
                        "are theirs as much as the engine's, and say nothing about the split.")
        words.append("Rerun the recording on a quiet machine before reading a verdict into it.")
    elif speed > 1.03:
        words.append(f"Here the split paid: the front end's work left the core's path, at a cost of {send:.2f} ms per "
                     "step for sending.")
    else:
        words.append(f"On this machine the split took the front end's work out from between the forward passes but "
                     f"added the core's sending ({send:.2f} ms per step), and found no idle core to run the front end "
                     "on: no faster. On a GPU the cores are idle while the device computes.")
    return " ".join(words)


# ----------------------------------------------------------------------------------------------- the GIL

# A front end's work per token, in pure Python: its SSE line, and a look for a stop string in the text so far.
FRONT_END_LOOP = """
import json, sys
text, n = "", 0
print("ready", flush=True)
while True:
    piece = " word%d" % (n % 97)
    text = (text + piece)[-256:]
    line = "data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]}) + "\\n\\n"
    "THE END" in text
    n += 1
"""


def _front_end_work(stop: threading.Event) -> None:
    """FRONT_END_LOOP's work, in a thread of this process, until `stop` is set."""
    text, n = "", 0
    while not stop.is_set():
        piece = f" word{n % 97}"
        text = (text + piece)[-256:]
        json.dumps({"id": "cmpl-1", "object": "text_completion",
                    "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]})
        _ = "THE END" in text
        n += 1


def _decode_steps(engine: LLMEngine, steps: int, budget_s: float | None = None) -> float:
    """The median time of `steps` engine steps (every request decoding); with `budget_s`, fewer once that much
    time has gone (at least one)."""
    times: list[float] = []
    while len(times) < steps and (budget_s is None or not times or sum(times) < budget_s):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _beside_a_thread(engine: LLMEngine, steps: int, budget_s: float) -> float:
    stop = threading.Event()
    worker = threading.Thread(target=_front_end_work, args=(stop,), daemon=True)
    worker.start()
    try:
        return _decode_steps(engine, steps, budget_s)
    finally:
        stop.set()
        worker.join()


def _beside_a_process(engine: LLMEngine, steps: int) -> float:
    worker = subprocess.Popen([sys.executable, "-c", FRONT_END_LOOP], stdout=subprocess.PIPE, text=True)
    try:
        worker.stdout.readline()  # "ready": the interpreter is up and looping
        return _decode_steps(engine, steps)
    finally:
        worker.kill()
        worker.wait()


def gil_beside_the_step(engine: LLMEngine, prompts: Sequence[Sequence[int]], steps: int = 12, rounds: int = 3,
                        budget_s: float = 1.0, rerun: str = "this cell") -> Finding:
    """Decode steps of len(prompts) requests, with one torch thread (a core left free), three ways in each
    round: alone; beside a thread of this process doing a front end's Python work nonstop (at most `budget_s`
    of steps: each can take seconds); beside a process doing the same. numbers: step_s (configuration ->
    median over rounds of each run's median step), thread (PairedRatio: beside a thread / alone), process
    (beside a process / alone) and waits (the step's extra time beside the thread, in switch intervals)."""
    params = SamplingParams(temperature=0, max_new_tokens=(3 * rounds + 1) * steps + 8, ignore_eos=True)
    ids = [engine.add_request(list(p), params).request_id for p in prompts]
    try:
        with torch_threads(1):
            engine.step()  # the prefill: every run below is decode steps only
            _decode_steps(engine, 4)  # warm-up
            trials = interleaved({"alone": lambda: _decode_steps(engine, steps),
                                  "beside a busy thread": lambda: _beside_a_thread(engine, steps, budget_s),
                                  "beside a busy process": lambda: _beside_a_process(engine, steps)},
                                 rounds, rerun=rerun)
    finally:
        for request_id in ids:
            engine.abort(request_id)
            engine.release(request_id)
    return describe_gil(trials, len(prompts))


def describe_gil(trials: Trials, batch: int, switch_s: float | None = None) -> Finding:
    """The words for `gil_beside_the_step`'s trials (each run: its median step in seconds). Only the thread's
    comparison is the claim the guard checks; the process's is expected to sit near 1, either side."""
    switch_s = sys.getswitchinterval() if switch_s is None else switch_s
    thread = trials.ratio("beside a busy thread", "alone", what="the step's time")
    process = PairedRatio("beside a busy process", "alone", tuple(
        a / b for a, b in zip(trials.values("beside a busy process"), trials.values("alone"))))
    step_s = {name: trials.median(name) for name in trials.results}
    waits = (step_s["beside a busy thread"] - step_s["alone"]) / switch_s
    text = (f"A decode step of {batch} requests with one torch thread took {step_s['alone'] * 1e3:,.1f} ms alone, "
            f"{step_s['beside a busy thread'] * 1e3:,.1f} ms beside a busy thread of this process and "
            f"{step_s['beside a busy process'] * 1e3:,.1f} ms beside a busy process (medians over {trials.rounds} "
            f"rounds). Round by round, beside the thread it took {thread.rounds()} as long as alone; beside the "
            f"process {process.rounds()}. ")
    holds = thread.value > 1.2 and thread.value > 1.1 * process.value
    if holds:
        free = " (one was free)" if trials.cpu.cores > 1 and not trials.cpu.busy else ""
        text += (f"The thread costs the step {thread.value:.1f}x: it needs no core of the step's{free}, only the "
                 f"interpreter. The step's extra {(step_s['beside a busy thread'] - step_s['alone']) * 1e3:.0f} ms are "
                 f"about {waits:,.0f} waits of one switch interval ({switch_s * 1e3:g} ms) each: the step waits for "
                 "the interpreter every time it comes back from an operator, while the busy thread holds it. The "
                 "process, with an interpreter of its own, "
                 + (f"costs little ({process.value:.2f}x)." if process.value < 1.15 else
                    f"costs {process.value:.2f}x: it shares the machine's cores and memory with the step."))
    else:
        text += ("Here the thread did not slow the step clearly more than the process did: these rounds cannot "
                 "show the interpreter being shared (rerun this cell on a quiet machine).")
    return Finding(text, holds, {"step_s": step_s, "thread": thread, "process": process, "waits": waits}, trials)


# ----------------------------------------------------------------------------------------------- against vLLM

SERVERS = {"minillm-thread": "minillm, engine in the server's process",
           "minillm-process": "minillm, engine core in its own process", "vllm": "vLLM"}
HOLDS_TTFT_S = 0.1  # a rate is "held" while TTFT p50 stays under this


def saved_results(name: str) -> dict | None:
    """benchmarks/results/<name>, or None when that benchmark has not been run in this copy."""
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def servers_in(saved: dict) -> list[str]:
    return [name for name in SERVERS if name in saved.get("servers", {})]


def saturation_ratio(saved: dict, name: str, other: str) -> float:
    """`name`'s output tok/s at saturation over `other`'s: with rounds (the servers driven in turns), the
    median of the rounds' own ratios — two runs moments apart — else the ratio of their rows."""
    a, b = saved["servers"][name], saved["servers"][other]
    if a.get("saturation_rounds") and len(a["saturation_rounds"]) == len(b.get("saturation_rounds", ())):
        return statistics.median(x["output_token_throughput"] / y["output_token_throughput"]
                                 for x, y in zip(a["saturation_rounds"], b["saturation_rounds"]))
    return a["saturation"]["output_token_throughput"] / b["saturation"]["output_token_throughput"]


def saturation_rows(saved: dict) -> list[list[str]]:
    """One row per server at saturation (its median round): output tok/s, against vLLM's, TTFT p50, TPOT p50,
    ITL p99."""
    runs = {name: saved["servers"][name]["saturation"] for name in servers_in(saved)}
    return [[SERVERS[name], f"{r['output_token_throughput']:,.0f}",
             f"{saturation_ratio(saved, name, 'vllm'):.2f}x" if "vllm" in runs else "-", f"{r['ttft_s']['p50']:.2f} s",
             f"{r['tpot_s']['p50'] * 1e3:.1f} ms", f"{r['itl_s']['p99'] * 1e3:.1f} ms"] for name, r in runs.items()]


def rate_rows(saved: dict) -> list[list[str]]:
    """One row per offered rate: each server's TTFT p50 and TPOT p50 there."""
    names = servers_in(saved)
    rates = sorted({r["rate"] for name in names for r in saved["servers"][name]["rates"]})
    rows = []
    for rate in rates:
        row = [f"{rate:g}"]
        for name in names:
            run = next((r for r in saved["servers"][name]["rates"] if r["rate"] == rate), None)
            row.append("-" if run is None else f"{run['ttft_s']['p50'] * 1e3:,.0f} / {run['tpot_s']['p50'] * 1e3:.1f}")
        rows.append(row)
    return rows


def _compare(ratio: float, better: str, worse: str, within: float = 0.05) -> str:
    """'about the same' within `within`, else how much `better` or `worse`."""
    if abs(ratio - 1) <= within:
        return f"about the same ({ratio:.2f}x)"
    return f"{ratio - 1:.0%} {better}" if ratio > 1 else f"{1 - ratio:.0%} {worse}"


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def highest_rate_held(saved: dict, name: str) -> float | None:
    """The highest offered rate at which `name` kept TTFT p50 under HOLDS_TTFT_S."""
    held = [r["rate"] for r in saved["servers"][name]["rates"] if r["ttft_s"]["p50"] < HOLDS_TTFT_S]
    return max(held, default=None)


def _rounds(saved: dict) -> str:
    rounds = saved.get("saturation_rounds")
    return f" (the median of {rounds} rounds' ratios, the servers driven in turns)" if rounds else ""


def versus_vllm_words(saved: dict, overhead: dict | None) -> str:
    """What the saved numbers say, computed from them (they are re-measured from time to time)."""
    sat = {name: saved["servers"][name]["saturation"]["output_token_throughput"] for name in servers_in(saved)}
    words = []
    if "minillm-process" in sat and "minillm-thread" in sat:
        split = saturation_ratio(saved, "minillm-process", "minillm-thread")
        words.append(f"At saturation our server delivered {sat['minillm-process']:,.0f} output tok/s with its engine "
                     f"core in a process of its own, {sat['minillm-thread']:,.0f} with the engine in the server's "
                     f"process: {_compare(split, 'more', 'less')} with the split{_rounds(saved)}.")
    if "vllm" in sat:
        best = max((n for n in sat if n != "vllm"), key=lambda n: saturation_ratio(saved, n, "vllm"), default=None)
        if best is not None:
            served = saturation_ratio(saved, best, "vllm")
            words.append(f"vLLM {saved.get('vllm_version', '')} served {sat['vllm']:,.0f} tok/s: our better mode "
                         f"({SERVERS[best]}) reached {served:.2f}x of it.")
            engines = saved.get("offline", {}).get("engines", {})
            if "minillm" in engines and "vllm" in engines:
                offline = engines["minillm"]["output_token_throughput"] / engines["vllm"]["output_token_throughput"]
                same = engines["vllm"].get("tokens_equal_minillm")
                words.append(f"Offline (LLM.generate against vllm.LLM, {saved['offline']['requests']} requests of "
                             f"mixed lengths — another workload — greedy tokens identical in {same} of them), our "
                             f"engine reached {offline:.2f}x vLLM's.")
                engine = ("the engine itself is behind" if offline < 0.95 else "the engine itself is ahead"
                          if offline > 1.05 else "the engines themselves are level")
                if served < offline - 0.05:
                    words.append(f"Served, we keep less of vLLM's pace than offline ({served:.2f}x against "
                                 f"{offline:.2f}x): the path between the engine and the socket — the front end's "
                                 "work, the messages, HTTP — costs us more than vLLM's costs it.")
                elif served > offline + 0.05:
                    words.append(f"Served, we come closer to vLLM than offline ({served:.2f}x against "
                                 f"{offline:.2f}x): vLLM's serving path costs it more than ours costs us; offline, "
                                 f"{engine}.")
                else:
                    words.append(f"Served and offline, the same share of vLLM's pace ({served:.2f}x, {offline:.2f}x): "
                                 f"{engine}, and the serving paths cost both about alike.")
        held = highest_rate_held(saved, "vllm")
        if held is not None:
            ttft = {n: next(r["ttft_s"]["p50"] for r in saved["servers"][n]["rates"] if r["rate"] == held)
                    for n in sat}
            words.append(f"The highest offered rate at which vLLM kept TTFT p50 under {HOLDS_TTFT_S * 1e3:.0f} ms was "
                         f"{held:g} requests/s; there, TTFT p50 was " + ", ".join(
                             f"{_duration(ttft[n])} for {SERVERS[n]}" for n in sat) + ".")
    if overhead is not None:
        median = overhead["median"]
        words.append(f"Without HTTP (benchmarks/async_overhead.py, {overhead['requests']} requests x "
                     f"{overhead['max_tokens']} tokens, medians of {len(overhead['rounds'])} rounds): AsyncLLM in one "
                     f"process delivered {median['async_vs_generate']:.2f}x LLM.generate's throughput, ProcessAsyncLLM "
                     f"{median['process_vs_generate']:.2f}x.")
    words += [f"Beware one point of the sweep: {note}." for note in sweep_anomalies(saved)]
    return " ".join(words)


def plot_versus(saved: dict):
    """Output tok/s at saturation; TTFT p50 and TPOT p50 against the offered rate. Returns the figure."""
    import matplotlib.pyplot as plt

    names = servers_in(saved)
    colours = {"minillm-thread": "#bab0ac", "minillm-process": "#4c78a8", "vllm": "#f58518"}
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 3.2))
    sat = [saved["servers"][n]["saturation"]["output_token_throughput"] for n in names]
    axes[0].barh(range(len(names)), sat, color=[colours[n] for n in names])
    axes[0].set_yticks(range(len(names)), [SERVERS[n].replace(", ", ",\n") for n in names], fontsize=8)
    axes[0].set(xlabel="output tokens/s", title="saturation (all at once)")
    for i, v in enumerate(sat):
        axes[0].text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    axes[0].set_xlim(0, max(sat) * 1.3)
    axes[0].invert_yaxis()  # in the table's order
    for ax, metric, label in ((axes[1], "ttft_s", "TTFT p50 (ms)"), (axes[2], "tpot_s", "TPOT p50 (ms)")):
        for n in names:
            runs = sorted(saved["servers"][n]["rates"], key=lambda r: r["rate"])
            ax.plot([r["rate"] for r in runs], [r[metric]["p50"] * 1e3 for r in runs], "o-", color=colours[n],
                    label=SERVERS[n])
        ax.set(xlabel="offered requests/s", ylabel=label, ylim=(0, None))
        ax.set_xticks(sorted({r["rate"] for n in names for r in saved["servers"][n]["rates"]}))
    axes[1].set_title("time to first token")
    axes[2].set_title("time per output token")
    handles, labels = axes[2].get_legend_handles_labels()  # below the panels: inside, it would hide points
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def sweep_anomalies(saved: dict) -> list[str]:
    """Sweep points that break the rule of a queue: at a higher offered rate, TTFT p50 cannot be much
    lower than at a lower one (the load only grows). Such a point was disturbed while it ran (another
    program took the cores): it is named, not explained away."""
    notes = []
    for name in servers_in(saved):
        runs = sorted(saved["servers"][name]["rates"], key=lambda r: r["rate"])
        for low, high in zip(runs, runs[1:]):
            if low["ttft_s"]["p50"] > max(2 * high["ttft_s"]["p50"], HOLDS_TTFT_S):
                notes.append(f"{SERVERS[name]} at {low['rate']:g} requests/s: TTFT p50 "
                             f"{_duration(low['ttft_s']['p50'])}, more than at {high['rate']:g} requests/s "
                             f"({_duration(high['ttft_s']['p50'])}) — a queue does not shrink as the load grows, so "
                             "this point was disturbed while it ran; read it as noise, and rerun the benchmark for a "
                             "clean one")
    return notes


def main(argv: Sequence[str] | None = None) -> Any:
    """`python -m experiments.ch10`: record both ways and save the course's recording."""
    recordings = [asyncio.run(record(mode)) for mode in ("thread", "process")]
    save(recordings)
    for rec in recordings:
        print(f"{rec.info['mode']}: {rec.tokens} tokens in {rec.wall_ms:.0f} ms; "
              + ", ".join(f"{k} {v:.1%}" for k, v in rec.share().items()))
    print(f"saved {RECORDING.relative_to(REPO)}")


if __name__ == "__main__":
    main()
