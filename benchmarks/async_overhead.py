"""What serving through AsyncLLM costs against `LLM.generate`, in-process and with the engine core in a
process of its own (chapter 10), on the same requests.

    python benchmarks/async_overhead.py [--rounds 5] [--requests 64] [--max-tokens 128]
    python benchmarks/async_overhead.py --plot-only

Three ways to run the same greedy requests (64 passages of the held-out text, 64 tokens each, exactly
128 new tokens each, the shipped target in float32, paged KV, 32 slots, max_model_len 1024):

    generate   LLM.generate: the step loop on the main thread, nothing else
    async      AsyncLLM in the same process: every request submitted at once, awaited on an event loop
    process    ProcessAsyncLLM: the same, with the engine core in a process of its own

Each round runs the three in turn, each in a fresh process (after a short warm-up in it); the result
is each way's output tokens/s and its ratio to `generate` in the same round, medians over the rounds.
The greedy tokens of the three are asserted equal. Results: benchmarks/results/async_overhead.json, .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("generate", "async", "process")


def worker(mode: str, requests: int, max_tokens: int) -> dict:
    """In this process: one way, timed from the first submission to the last answer."""
    import asyncio
    import time

    import minillm
    from minillm.config import EngineConfig
    from minillm.sampling import SamplingParams

    config = EngineConfig(kv="paged", max_num_seqs=32, max_model_len=1024, dtype="float32")
    params = SamplingParams(temperature=0, max_new_tokens=max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_new_tokens=8)

    def prompts(tokenizer) -> list[list[int]]:
        text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
        return [text[(97 * i) % (len(text) - 64):][:64] for i in range(requests)]

    if mode == "generate":
        from minillm.engine import LLM

        llm = LLM("target", config)
        ids = prompts(llm.tokenizer)
        llm.generate(ids[:4], warm, use_tqdm=False)
        start = time.perf_counter()
        outs = llm.generate(ids, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    else:
        if mode == "async":
            from minillm.async_engine import AsyncLLM

            llm = AsyncLLM("target", config)
        else:
            from minillm.engine_core import ProcessAsyncLLM

            llm = ProcessAsyncLLM("target", config)
        ids = prompts(llm.tokenizer)

        async def go():
            await asyncio.gather(*(llm.submit(p, warm) for p in ids[:4]))
            start = time.perf_counter()
            outs = await asyncio.gather(*(llm.submit(p, params) for p in ids))
            return outs, time.perf_counter() - start

        outs, seconds = asyncio.run(go())
        if mode == "process":
            llm.close()
    tokens = [list(o.token_ids) for o in outs]
    return {"seconds": seconds, "tok_s": sum(map(len, tokens)) / seconds, "tokens": tokens}


def measure(mode: str, requests: int, max_tokens: int) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); from async_overhead import worker; "
            f"print(json.dumps(worker({mode!r}, {requests}, {max_tokens})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(rounds: int, requests: int, max_tokens: int) -> dict:
    rows = []
    for r in range(rounds):
        got = {mode: measure(mode, requests, max_tokens) for mode in MODES}
        for mode in MODES[1:]:
            assert got[mode]["tokens"] == got["generate"]["tokens"], f"{mode} changed the greedy tokens"
        row = {mode: got[mode]["tok_s"] for mode in MODES}
        rows.append(row | {f"{mode}_vs_generate": row[mode] / row["generate"] for mode in MODES[1:]})
        print(f"round {r + 1}: " + ", ".join(f"{mode} {row[mode]:.0f} tok/s" for mode in MODES), flush=True)
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "requests": requests, "prompt_tokens": 64,
            "max_tokens": max_tokens, "slots": 32, "rounds": rows,
            "median": {key: median(row[key] for row in rows) for key in rows[0]}}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    values = [results["median"][mode] for mode in MODES]
    bars = ax.bar(range(len(MODES)), values, color=["C7", "C0", "C2"])
    labels = [f"{v:.0f}" if mode == "generate" else f"{v:.0f}\n({results['median'][f'{mode}_vs_generate']:.2f}x)"
              for mode, v in zip(MODES, values)]
    ax.bar_label(bars, labels, fontsize=8)
    names = ["LLM.generate", "AsyncLLM\n(in-process)", "ProcessAsyncLLM\n(engine core process)"]
    ax.set_xticks(range(len(MODES)), names)
    ax.set_ylabel("output tokens/s (median of rounds)")
    ax.set_ylim(0, 1.2 * max(values))
    ax.set_title(f"{results['requests']} requests x {results['max_tokens']} tokens, 32 slots ({results['machine']})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "async_overhead"), help="OUT.json and OUT.png")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.plot_only:
        results = run(args.rounds, args.requests, args.max_tokens)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    results = json.loads(out.with_suffix(".json").read_text())
    plot(results, out.with_suffix(".png"))
    m = results["median"]
    print(f"AsyncLLM {m['async_vs_generate']:.2f}x, ProcessAsyncLLM {m['process_vs_generate']:.2f}x LLM.generate "
          f"(medians of {len(results['rounds'])} rounds)")


if __name__ == "__main__":
    main()
