"""Chapter 9 benchmark: our server under load, and the simulator's prediction of it, in one run.

    python benchmarks/serve_load.py [--calibration-rates 6 30] [--load-fractions 0.3 0.7 1.5] [--rates ...]

1. The OpenAI-compatible server (minillm/server/) runs in this process on a loopback port, over the
   shipped target (paged KV, 16 slots).
2. Calibration: load runs at --calibration-rates (other rates than those predicted; a light and a
   heavy one, so that batch sizes vary); the step-time model (minillm/sim/step_time.py) is fitted by
   least squares on the engine's own trace of them — each step's time up to the next step, so the
   server's work between steps counts. The load generator runs in a process of its own, as a real
   client would: it must not take the server's interpreter.
3. For each rate (by default 0.3, 0.7 and 1.5 times the capacity the heavier calibration run
   reached, so that the runs fall below, approaching and past it on any machine): a seeded Poisson
   load run (minillm/loadgen.py: streaming /v1/completions, the held-out text's passages as prompts,
   exactly --max-tokens each), then the simulator on the same requests — the same arrival times, the
   same prompt lengths in tokens — and the two compared: output-token throughput and TTFT p50,
   simulated over measured. Also reported: a TTFT's mean time outside the engine (the client's TTFT
   minus the engine's own: HTTP, tokenizing, the chunk's way back), which the simulator, modelling
   the engine, leaves out.
Results: benchmarks/results/serve_load.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.pool
import platform
import socket
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402

import minillm  # noqa: E402
from minillm.async_engine import AsyncLLM  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLMEngine  # noqa: E402
from minillm.loadgen import Slo, prompts_from_text, run_load, summarize  # noqa: E402
from minillm.server import build_app  # noqa: E402
from minillm.sim import SimRequest, StepTimeModel, simulate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODEL_NAME = "minillm-target"


def start_server(engine: LLMEngine) -> tuple[uvicorn.Server, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(AsyncLLM(engine=engine), MODEL_NAME), host="127.0.0.1",
                                           port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/v1"


def _client(url: str, prompts: list[str], rate: float, max_tokens: int, seed: int) -> tuple[list, float]:
    return asyncio.run(run_load(url, MODEL_NAME, prompts, rate, max_tokens, seed, extra={"ignore_eos": True}))


def load_run(client: multiprocessing.pool.Pool, engine: LLMEngine, url: str, prompts: list[str], rate: float,
             max_tokens: int, seed: int) -> tuple[list, float, list]:
    """One load run, the load generator in its own process (as a real client is: it must not take the
    server's CPU or interpreter); also returns the engine's own Request objects of it (their metrics)."""
    admitted, add_request = [], engine.add_request
    engine.add_request = lambda *a, **k: admitted.append(add_request(*a, **k)) or admitted[-1]
    try:
        records, wall = client.apply(_client, (url, prompts, rate, max_tokens, seed))
    finally:
        engine.add_request = add_request
    return records, wall, admitted


def mean_ttft(ttfts: list) -> float:
    values = [t for t in ttfts if t is not None]
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="default: --load-fractions of capacity")
    parser.add_argument("--load-fractions", type=float, nargs="+", default=[0.3, 0.7, 1.5],
                        help="rates as fractions of the capacity the calibration measured")
    parser.add_argument("--calibration-rates", type=float, nargs="+", default=[6.0, 30.0])
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    config = EngineConfig(kv="paged", max_num_seqs=16, max_model_len=1024)
    engine = LLMEngine(model, tokenizer, config)
    server, url = start_server(engine)
    client = multiprocessing.get_context("spawn").Pool(1)
    text = (minillm.ASSETS_DIR / "heldout_sample.txt").read_text()
    slo = Slo(ttft_s=1.0, tpot_s=0.05)

    traces, capacity = [], 0.0  # calibration: other prompts and seeds than the runs predicted, fitted together
    for i, rate in enumerate(args.calibration_rates):
        calibration = prompts_from_text(text, args.num_prompts, seed=args.seed + 1000 + i)
        first = engine.trace.next_step
        records, wall, _ = load_run(client, engine, url, calibration, rate, args.max_tokens, args.seed + 1000 + i)
        traces.append(type(engine.trace)(config.max_num_seqs, steps=[s for s in engine.trace.steps if s.step >= first]))
        capacity = max(capacity, sum(r.output_tokens for r in records) / wall / args.max_tokens)  # requests / s

    step_time, residuals = StepTimeModel.fit(traces, busy_gap=0.05)
    print(f"step-time model: {step_time}; residuals: rms {1e3 * float((residuals ** 2).mean() ** 0.5):.2f} ms over "
          f"{len(residuals)} steps; capacity about {capacity:.1f} requests/s")
    # below, approaching and past capacity; at the knee itself TTFT swings with every hiccup of the machine
    rates = args.rates or [round(f * capacity, 1) for f in args.load_fractions]

    rows = []
    for rate in rates:
        prompts = prompts_from_text(text, args.num_prompts, seed=args.seed)
        records, wall, admitted = load_run(client, engine, url, prompts, rate, args.max_tokens, args.seed)
        measured = summarize(records, wall, slo)
        workload = [SimRequest(r.sent, len(tokenizer.encode(p)), args.max_tokens) for r, p in zip(records, prompts)]
        predicted = simulate(workload, config, step_time, engine.max_model_len, engine.pool.num_blocks).summary()
        outside = mean_ttft([r.ttft for r in records]) - mean_ttft([r.metrics.ttft for r in admitted])
        row = {"rate": rate, "measured": measured, "simulated": predicted, "ttft_outside_engine_s": outside,
               "throughput_ratio": predicted["output_token_throughput"] / measured["output_token_throughput"],
               "ttft_p50_ratio": predicted["ttft_p50_s"] / measured["ttft_s"]["p50"]}
        print(f"rate {rate:g}/s: measured {measured['output_token_throughput']:.0f} tok/s, TTFT p50 "
              f"{1e3 * measured['ttft_s']['p50']:.0f} ms, TPOT p50 {1e3 * measured['tpot_s']['p50']:.1f} ms; simulated "
              f"{predicted['output_token_throughput']:.0f} tok/s ({row['throughput_ratio']:.2f}x), TTFT p50 "
              f"{1e3 * predicted['ttft_p50_s']:.0f} ms ({row['ttft_p50_ratio']:.2f}x); outside the engine "
              f"{1e3 * outside:.0f} ms")
        rows.append(row)
    server.should_exit = True
    client.close()
    RESULTS.mkdir(exist_ok=True)
    saved = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
             "config": {"max_num_seqs": 16, "kv": "paged", "max_tokens": args.max_tokens,
                        "num_prompts": args.num_prompts}, "step_time": step_time.__dict__,
             "calibration_rates": args.calibration_rates, "capacity_rps": capacity,
             "residual_rms_s": float((residuals ** 2).mean() ** 0.5), "rows": rows}
    (RESULTS / "serve_load.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, RESULTS / "serve_load.png")
    print(f"wrote {RESULTS / 'serve_load.json'} and .png")


def plot(saved: dict, path: Path) -> None:
    rows = saved["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    rates = [r["rate"] for r in rows]
    for ax, key, label, scale in ((axes[0], "output_token_throughput", "output tokens / s", 1),
                                  (axes[1], "ttft_p50", "TTFT p50 (ms)", 1e3)):
        measured = [(r["measured"][key] if key != "ttft_p50" else r["measured"]["ttft_s"]["p50"]) * scale for r in rows]
        simulated = [(r["simulated"][key] if key != "ttft_p50" else r["simulated"]["ttft_p50_s"]) * scale
                     for r in rows]
        ax.plot(rates, measured, "o-", label="measured (load generator)")
        ax.plot(rates, simulated, "s--", label="simulated (real scheduler, fitted step time)")
        ax.set(xlabel="arrival rate (requests / s)", ylabel=label, ylim=(0, None))
        ax.legend(fontsize=8)
    fig.suptitle("our server under Poisson load, and the simulator's prediction")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
