"""Chapter 4 benchmark: the same KV bytes, reserved per request vs paged.

    python benchmarks/paged_capacity.py [--requests 64] [--reserved-slots 8] [--max-model-len 2048]

One KV byte budget = what `--reserved-slots` requests of `--max-model-len` tokens reserve. On the
shipped target, greedy, ignore_eos, the mixed workload of benchmarks/batching.py (prompts 16–128
tokens, outputs 8–256):
  max-length reservation  EngineConfig(kv="contiguous", max_num_seqs=budget // (max_model_len x bytes/token))
  paged                   EngineConfig(kv="paged", kv_cache_bytes=budget, block_size=16); slots are not the limit
Measured from each engine's trace: peak concurrent requests, output tok/s, and the share of
allocated KV that holds live tokens (summed over steps). Outputs are asserted identical. Results go
to benchmarks/results/paged_capacity.json and paged_capacity.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from batching import make_workload  # noqa: E402  (benchmarks/batching.py, beside this script)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

import minillm  # noqa: E402
from minillm.attention.paged import kv_bytes_per_token  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLM  # noqa: E402
from minillm.trace import Trace  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def kv_usage(trace: Trace, reserved_per_request: int | None) -> tuple[list[int], list[int]]:
    """Per step: live KV tokens, and allocated KV tokens (reserved slots, or blocks x block_size)."""
    live, allocated = [], []
    for step in trace.steps:
        live.append(sum(step.kv_tokens.values()))
        if reserved_per_request is not None:
            allocated.append(len(step.kv_tokens) * reserved_per_request)
        else:
            allocated.append(sum(len(t) for t in step.blocks.values()) * trace.block_size)
    return live, allocated


def run(name: str, config: EngineConfig, workload) -> dict:
    llm = LLM(config=config)
    params = [minillm.SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for _, n in workload]
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in workload], params, use_tqdm=True)
    wall = time.perf_counter() - start
    trace = llm.engine.trace
    live, allocated = kv_usage(trace, config.max_model_len if config.kv == "contiguous" else None)
    concurrent = [len(s.kv_tokens) for s in trace.steps]
    row = {"system": name, "kv_cache_bytes": llm.engine.cache.nbytes, "wall_s": wall,
           "output_tok_per_s": sum(n for _, n in workload) / wall, "peak_concurrent_requests": max(concurrent),
           "mean_concurrent_requests": sum(concurrent) / len(concurrent),
           "live_share_of_allocated_kv": sum(live) / sum(allocated),
           "preemptions": sum(len(s.preempted) for s in trace.steps), "steps": len(trace.steps)}
    print(f"  {name:24s} peak {row['peak_concurrent_requests']:3d} requests, {row['output_tok_per_s']:7.1f} tok/s, "
          f"live/allocated KV {row['live_share_of_allocated_kv']:.1%}, {row['preemptions']} preemptions")
    return {"row": row, "outputs": [o.token_ids for o in outs], "curve": (concurrent, live, allocated)}


COLOURS = {"max-length reservation": "#777", "paged": "#2a7"}


def plot(curves: dict[str, tuple[list[int], list[int], list[int]]], budget_tokens: int, path: Path) -> None:
    """The figure: requests running per step (left), then one panel per engine with its allocated KV as a
    light area and its live KV as a dark area in front (the light part is allocated but empty), on one y scale.
    `curves` maps a system name to its per-step (concurrent requests, live tokens, allocated tokens)."""
    fig, axes = plt.subplots(1, 1 + len(curves), figsize=(13, 3.8), gridspec_kw={"width_ratios": [1.1, 1, 1]})
    left, panels = axes[0], axes[1:]
    for name, (concurrent, _, _) in curves.items():
        left.plot(range(len(concurrent)), concurrent, color=COLOURS.get(name, "#333"), drawstyle="steps-post",
                  linewidth=1.2, label=name)
    left.set(xlabel="engine step", ylabel="requests running", title="concurrent requests, same KV bytes",
             ylim=(0, None))
    left.legend(fontsize=8)
    budget_k = budget_tokens / 1024
    for ax, (name, (_, live, allocated)) in zip(panels, curves.items()):
        colour, steps = COLOURS.get(name, "#333"), range(len(live))
        ax.fill_between(steps, [a / 1024 for a in allocated], step="post", color=colour, alpha=0.25, linewidth=0)
        ax.fill_between(steps, [x / 1024 for x in live], step="post", color=colour, alpha=0.9, linewidth=0)
        ax.axhline(budget_k, color="#c00", linewidth=0.8, linestyle=":")
        share = sum(live) / sum(allocated)
        ax.set(xlabel=f"engine step (of {len(live)})", ylabel="K tokens of KV", ylim=(0, budget_k * 1.08),
               xlim=(0, len(live)), title=f"{name}: live {share:.0%} of allocated")
    for ax in panels[1:]:
        ax.sharey(panels[0])
    key = [Patch(color="#555", alpha=0.9, linewidth=0, label="live KV (tokens whose K/V are held)"),
           Patch(color="#555", alpha=0.25, linewidth=0, label="allocated, not holding a token"),
           Line2D([], [], color="#c00", linewidth=0.8, linestyle=":", label=f"KV budget ({budget_k:.0f}K tokens)")]
    fig.legend(handles=key, loc="lower center", ncol=3, fontsize=9, frameon=False, bbox_to_anchor=(0.62, 0))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--reserved-slots", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=2048, help="default: the shipped model's context")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = minillm.load_tokenizer()
    workload = make_workload("mixed", args.requests, tokenizer, seed=args.seed)
    model_config = minillm.load_model().config
    per_token = kv_bytes_per_token(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim,
                                   torch.float32)
    budget = args.reserved_slots * args.max_model_len * per_token
    print(f"KV budget {budget / 2**20:.0f} MiB = {args.reserved_slots} x {args.max_model_len} tokens x "
          f"{per_token} bytes; {len(workload)} requests")
    reserve = run("max-length reservation", EngineConfig(max_num_seqs=args.reserved_slots,
                                                         max_model_len=args.max_model_len), workload)
    paged = run("paged", EngineConfig(max_num_seqs=256, max_model_len=args.max_model_len, kv="paged",
                                      block_size=args.block_size, kv_cache_bytes=budget), workload)
    assert reserve["outputs"] == paged["outputs"], "paged and reserved outputs differ"
    rows = [reserve["row"], paged["row"]]
    ratios = {"peak_concurrent_paged_vs_reserved": rows[1]["peak_concurrent_requests"]
              / rows[0]["peak_concurrent_requests"],
              "tok_per_s_paged_vs_reserved": rows[1]["output_tok_per_s"] / rows[0]["output_tok_per_s"]}
    print("  ratios:", {k: round(v, 2) for k, v in ratios.items()})
    RESULTS.mkdir(exist_ok=True)
    curves = {res["row"]["system"]: res["curve"] for res in (reserve, paged)}  # per step: running, live, allocated
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "kv_budget_bytes": budget, "max_model_len": args.max_model_len, "block_size": args.block_size,
            "requests": len(workload), "seed": args.seed}
    result = {"meta": meta, "rows": rows, "ratios": ratios, "outputs_identical": True, "curves": curves}
    (RESULTS / "paged_capacity.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(curves, budget // per_token, RESULTS / "paged_capacity.png")
    print(f"wrote {RESULTS / 'paged_capacity.json'} and paged_capacity.png")


if __name__ == "__main__":
    main()
