"""What the batched sampler costs a decode step: with every new parameter off, against the engine
before it (the sampler that drew one row at a time); and with penalties and logprobs on, against off.

    python benchmarks/sampling_overhead.py [--baseline REV] [--batches 1 16] [--rounds 7]
    python benchmarks/sampling_overhead.py --plot-only

The baseline is the repository at REV (default: the commit before the batched sampler), extracted
with `git archive` into a temporary folder. Each measurement: the shipped target in float32, one
torch thread, a paged cache, `batch` requests of 64-token prompts decoding 96 tokens each, greedy;
the figure is the median duration of the engine's steps in which every request decodes
(`engine.trace`: schedule, forward, sample, book-keeping). Each round runs two processes:

    the baseline tree: "off"  |  this tree: "off" and "on", two engines stepping in turn

"On" adds repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5 and logprobs=5 to the
same greedy requests, so on / off is the cost of the new parameters alone, measured step against
step in one process; off / before compares two processes run back to back. The result is each
ratio's median over the rounds, every round's beside it. The greedy tokens of "off" and the
baseline are asserted equal. Results: benchmarks/results/sampling_overhead.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_BASELINE = "7f2f009^"  # the engine before the batched sampler (commit 7f2f009)
NEW_TOKENS, PROMPT_LEN = 96, 64
ON = dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5, logprobs=5)


def worker(batch: int, configs: list[str]) -> dict:
    """In this process: one engine per configuration ("off", "on"), sharing one model, stepping in
    turn until all finish. For each: the median duration of its all-decode steps, and its tokens."""
    import torch

    import minillm
    from minillm.config import EngineConfig
    from minillm.engine import LLMEngine
    from minillm.model import load
    from minillm.sampling import SamplingParams

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core: the other is left to the machine, and the rounds vary less
    model, tokenizer = load("target", dtype="float32", device="cpu")
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    prompts = [text[(97 * i) % (len(text) - PROMPT_LEN):][:PROMPT_LEN] for i in range(batch)]
    engines, ids = {}, {}
    for name in configs:
        engines[name] = LLMEngine(model, tokenizer, EngineConfig(kv="paged", max_num_seqs=batch, max_model_len=512))
        extra = ON if name == "on" else {}
        ids[name] = [engines[name].add_request(p, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True,
                                                                 temperature=0, **extra)).request_id
                     for p in prompts]
    while any(engine.has_unfinished() for engine in engines.values()):
        for engine in engines.values():
            if engine.has_unfinished():
                engine.step()
    out = {}
    for name, engine in engines.items():
        steps = [s.duration for s in engine.trace.steps if s.decode_tokens == batch and not s.prefill_tokens]
        out[name] = {"step_s": median(steps), "steps": len(steps),
                     "tokens": [engine.output(i).token_ids for i in ids[name]]}
    return out


def measure(tree: Path, batch: int, configs: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'benchmarks')!r});"
            f"from sampling_overhead import worker; print(json.dumps(worker({batch}, {configs!r})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def extract(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", rev, "minillm"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def run(baseline: str, batches: list[int], rounds: int) -> dict:
    results = {"baseline": baseline, "baseline_commit": subprocess.run(
        ["git", "rev-parse", "--short", baseline], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch_threads": 1, "rounds": rounds,
        "on": ON, "batches": {}}
    with tempfile.TemporaryDirectory() as tmp:
        base = extract(baseline, Path(tmp))
        for batch in batches:
            rows = []
            for r in range(rounds):
                old = measure(base, batch, ["off"])["off"]
                new = measure(ROOT, batch, ["off", "on"])
                off, on = new["off"], new["on"]
                assert old["tokens"] == off["tokens"], "the batched sampler changed greedy tokens"
                rows.append({"baseline_s": old["step_s"], "off_s": off["step_s"], "on_s": on["step_s"],
                             "off_vs_baseline": off["step_s"] / old["step_s"],
                             "on_vs_off": on["step_s"] / off["step_s"]})
                print(f"batch {batch} round {r + 1}: baseline {1e3 * old['step_s']:.2f} ms, "
                      f"off {1e3 * off['step_s']:.2f} ms, on {1e3 * on['step_s']:.2f} ms", flush=True)
            results["batches"][str(batch)] = {
                "rounds": rows, "off_vs_baseline": median(r["off_vs_baseline"] for r in rows),
                "on_vs_off": median(r["on_vs_off"] for r in rows),
                "baseline_s": min(r["baseline_s"] for r in rows), "off_s": min(r["off_s"] for r in rows),
                "on_s": min(r["on_s"] for r in rows)}
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = list(results["batches"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for j, (key, label) in enumerate([("baseline_s", f"before ({results['baseline_commit']}), all off"),
                                      ("off_s", "batched sampler, all off"),
                                      ("on_s", "batched sampler, penalties + logprobs (greedy)")]):
        values = [1e3 * median(row[key] for row in results["batches"][b]["rounds"]) for b in batches]
        bars = ax.bar([i + (j - 1) * width for i in range(len(batches))], values, width, label=label)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    for i, b in enumerate(batches):
        row = results["batches"][b]
        ax.annotate(f"off/before {row['off_vs_baseline']:.2f}x\non/off {row['on_vs_off']:.2f}x", (i, 0),
                    xytext=(0, -38), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("decode step, ms (median of rounds)")
    ax.set_ylim(0, 1.25 * ax.get_ylim()[1])  # room for the legend above the bars
    ax.set_title("Decode step, batched sampler (target, fp32, CPU, 1 thread)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.subplots_adjust(bottom=0.22)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "sampling_overhead"), help="OUT.json and OUT.png")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.plot_only:
        results = run(args.baseline, args.batches, args.rounds)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    results = json.loads(out.with_suffix(".json").read_text())
    plot(results, out.with_suffix(".png"))
    for b, row in results["batches"].items():
        print(f"batch {b}: off vs before {row['off_vs_baseline']:.3f}x, penalties+logprobs vs off "
              f"{row['on_vs_off']:.3f}x (medians of {results['rounds']} rounds)")


if __name__ == "__main__":
    main()
