"""Chapter 13 benchmark: the same engine at tensor_parallel_size 1, 2 and 4, in one run.

    python benchmarks/tensor_parallel.py [--sizes 1 2 4] [--repeats 3]
    python benchmarks/tensor_parallel.py --plot-only      (redraw the plot from the saved JSON)
    python benchmarks/tensor_parallel.py --out /tmp/check  (write the results elsewhere: a trial run)

Workload (shipped target, greedy, ignore_eos): --batch requests with 24-token prompts decoding
--decode-tokens tokens each (the decode steps), then one prompt of --prompt-len tokens alone (a
prefill step). Measured per size: the median decode step and prefill step (ms), rank 0's time inside
all-reduces and the logits gather per step (which includes waiting for the slowest rank), the bytes
each rank sends into all-reduces per token per layer, and each rank's weight and KV-cache bytes.
The sizes run alternating, --repeats times; each row is the median over repeats; the ratios are
medians of the ratio within each repeat. Tokens are asserted identical across sizes.

On a CPU the ranks are processes sharing the machine's cores (the engine gives each cores / size
torch threads): a step does not get faster, it pays for the collectives. What tensor parallelism buys
is the memory column: each rank holds 1/size of the weights and of the KV heads.
Results: benchmarks/results/tensor_parallel.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import minillm  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLMEngine  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def collective_seconds(engine: LLMEngine) -> dict[str, float]:
    """Rank 0's seconds and bytes in all-reduces and gathers so far (zeros at size 1)."""
    if engine.workers is None:
        return {"all-reduce": 0.0, "gather": 0.0, "all-reduce bytes": 0}
    totals = engine.workers.communicator.totals
    return {"all-reduce": totals["all-reduce"].seconds, "gather": totals["gather"].seconds,
            "all-reduce bytes": totals["all-reduce"].nbytes}


def phase(engine: LLMEngine, requests: list[tuple[list[int], int]]) -> tuple[list[float], dict, list, int]:
    """Run `requests` to the end: each step's seconds, rank 0's collective time and bytes over the phase,
    the outputs, and the tokens the passes computed."""
    before = collective_seconds(engine)
    first = engine.trace.next_step
    ids = [engine.add_request(prompt, greedy(n)).request_id for prompt, n in requests]
    while engine.has_unfinished():
        engine.step()
    steps = [s for s in engine.trace.steps if s.step >= first]
    after = collective_seconds(engine)
    outputs = [engine.output(i).token_ids for i in ids]
    for i in ids:
        engine.release(i)
    tokens = sum(s.num_tokens for s in steps)
    return [s.duration for s in steps], {k: after[k] - before[k] for k in after}, outputs, tokens


def measure(model, size: int, args, prompts: list[list[int]], long_prompt: list[int]) -> dict:
    engine = LLMEngine(model, None, EngineConfig(tensor_parallel_size=size, kv="paged", max_num_seqs=args.batch,
                                                 max_model_len=1024), detokenize=False)
    try:
        phase(engine, [(prompts[0], 4)])  # warm-up: oneDNN's packed weights, the C kernel, the first collectives
        decode, decode_comm, outputs, decode_tokens = phase(engine, [(p, args.decode_tokens) for p in prompts])
        decode = decode[1:]  # the batch's prefill step is not a decode step
        prefill, prefill_comm, long_output, _ = phase(engine, [(long_prompt, 1)])
        layers, hidden = model.config.num_layers, model.config.hidden_size
        shard = engine.model
        weight_bytes = sum(p.numel() * p.element_size() for p in shard.parameters())
        return {"size": size, "threads_per_rank": torch.get_num_threads(),
                "decode_step_ms": statistics.median(decode) * 1e3,
                "decode_allreduce_ms_per_step": decode_comm["all-reduce"] / (len(decode) + 1) * 1e3,
                "decode_gather_ms_per_step": decode_comm["gather"] / (len(decode) + 1) * 1e3,
                "prefill_step_ms": prefill[0] * 1e3,
                "prefill_allreduce_ms": prefill_comm["all-reduce"] * 1e3,
                "prefill_gather_ms": prefill_comm["gather"] * 1e3,
                "allreduce_bytes_per_token_per_layer": decode_comm["all-reduce bytes"] / decode_tokens / layers
                if size > 1 else 0, "hidden_bytes": hidden * 4,
                "weight_bytes_per_rank": weight_bytes,
                "kv_bytes_per_token_per_rank": engine.cache.bytes_per_token,
                "outputs": outputs + long_output}
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((args.out / "tensor_parallel.json").read_text()), args.out / "tensor_parallel.png")
        return
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    prompts = [text[24 * i : 24 * (i + 1)] for i in range(args.batch)]
    long_prompt = (text * (1 + args.prompt_len // len(text)))[: args.prompt_len]
    runs: dict[int, list[dict]] = {size: [] for size in args.sizes}
    for _ in range(args.repeats):
        for size in args.sizes:
            m = measure(model, size, args, prompts, long_prompt)
            runs[size].append(m)
            print(f"TP={size}: decode step {m['decode_step_ms']:6.2f} ms (all-reduce "
                  f"{m['decode_allreduce_ms_per_step']:5.2f}, gather {m['decode_gather_ms_per_step']:4.2f})  prefill "
                  f"{m['prefill_step_ms']:6.1f} ms (all-reduce {m['prefill_allreduce_ms']:5.1f})  weights/rank "
                  f"{m['weight_bytes_per_rank'] / 2**20:5.2f} MiB")
    reference = runs[args.sizes[0]][0]["outputs"]
    assert all(r["outputs"] == reference for rs in runs.values() for r in rs), "tokens differ between sizes"
    keys = [k for k in runs[args.sizes[0]][0] if k != "outputs"]
    rows = {str(size): {k: statistics.median(r[k] for r in rs) for k in keys} for size, rs in runs.items()}
    base = args.sizes[0]
    ratios = {str(size): {
        "decode_step_vs_tp1": statistics.median(r["decode_step_ms"] / b["decode_step_ms"]
                                                for r, b in zip(runs[size], runs[base])),
        "prefill_step_vs_tp1": statistics.median(r["prefill_step_ms"] / b["prefill_step_ms"]
                                                 for r, b in zip(runs[size], runs[base])),
        "decode_allreduce_share": statistics.median((r["decode_allreduce_ms_per_step"] + r["decode_gather_ms_per_step"])
                                                    / r["decode_step_ms"] for r in runs[size]),
        "weight_bytes_per_rank_vs_tp1": rows[str(size)]["weight_bytes_per_rank"]
        / rows[str(base)]["weight_bytes_per_rank"],
        "kv_bytes_per_rank_vs_tp1": rows[str(size)]["kv_bytes_per_token_per_rank"]
        / rows[str(base)]["kv_bytes_per_token_per_rank"]} for size in args.sizes}
    for size, r in ratios.items():
        print(f"TP={size}: decode step {r['decode_step_vs_tp1']:.2f}x TP=1, collectives "
              f"{r['decode_allreduce_share']:.0%} of the step; weights per rank "
              f"{r['weight_bytes_per_rank_vs_tp1']:.2f}x, KV per rank "
              f"{r['kv_bytes_per_rank_vs_tp1']:.2f}x")
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "model": "the shipped target (Qwen2 shape: 8 layers, 4 heads, 2 KV heads, hidden 256, vocab 4096)",
            "batch": args.batch, "decode_tokens": args.decode_tokens, "prompt_len": args.prompt_len,
            "repeats": args.repeats, "backend": "gloo over loopback (CPU processes)", "tokens_identical": True}
    saved = {"meta": meta, "rows": rows, "ratios": ratios,
             "runs": {str(s): [{k: v for k, v in r.items() if k != "outputs"} for r in rs] for s, rs in runs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tensor_parallel.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, args.out / "tensor_parallel.png")
    print(f"wrote {args.out / 'tensor_parallel.json'} and tensor_parallel.png")


def plot(saved: dict, path: Path) -> None:
    """Left: the decode step split into rank 0's collectives and the rest, per size. Right: what each rank
    holds, against TP=1 (weights, KV per token)."""
    rows = saved["rows"]
    sizes = sorted(rows, key=int)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    comm = [rows[s]["decode_allreduce_ms_per_step"] + rows[s]["decode_gather_ms_per_step"] for s in sizes]
    rest = [rows[s]["decode_step_ms"] - c for s, c in zip(sizes, comm)]
    labels = [f"TP={s}" for s in sizes]
    left.bar(labels, rest, label="compute (and the rest of the step)", color="#4c78a8")
    left.bar(labels, comm, bottom=rest, label="all-reduce + gather (incl. waiting)", color="#e45756")
    left.set_ylabel("decode step (ms), rank 0")
    left.set_title(f"one decode step, batch {saved['meta']['batch']}: {saved['meta']['backend']}")
    left.legend(loc="upper left")
    base = rows[sizes[0]]
    x = range(len(sizes))
    right.bar([i - 0.2 for i in x], [rows[s]["weight_bytes_per_rank"] / base["weight_bytes_per_rank"] for s in sizes],
              width=0.4, label="weights per rank", color="#54a24b")
    right.bar([i + 0.2 for i in x], [rows[s]["kv_bytes_per_token_per_rank"] / base["kv_bytes_per_token_per_rank"]
                                     for s in sizes], width=0.4, label="KV bytes per token per rank", color="#f58518")
    right.set_xticks(list(x), labels)
    right.set_ylim(0, 1.15)
    right.set_ylabel("vs TP=1")
    right.set_title("what each rank holds (KV heads replicate past 2 ranks)")
    right.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
