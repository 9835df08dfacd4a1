"""The CPU paged-attention kernels (minillm/attention/csrc/paged_attention.c), decode and prefill,
against the torch reference (minillm/attention/paged_ops.py), on the shipped model's attention shape.

    python benchmarks/cpu_attention_kernels.py [--repeats 9]

Decode attention reads each cached K/V byte once per step: on a CPU it waits for memory. So each
point runs 8 layers' worth of separate caches (as a step does, more than the last-level cache holds),
with the blocks of every sequence either consecutive in memory (a fresh engine) or scattered (one
that has run a while). Batches of 1 to 32 sequences, contexts of 128 to 1024 tokens. Each time is
the median of `--repeats` runs of the 8 layers, the kernel and the reference alternated; the outputs
are compared. Reported: milliseconds per layer, the speedup over the reference, and the bandwidth
the kernel reached (K and V bytes read / time).

Prefill: fresh prompts of 64 to 512 tokens, one to four of them in a step (as the engine's prefill
steps hold), blocks scattered; the reference gathers each prompt's K/V and calls SDPA's flash kernel.
Reported: milliseconds per layer, the speedup, and the kernel's GFLOP/s (4 x heads x head_dim
multiply-adds per (query, visible key) pair, halved by the causal mask).

Results: benchmarks/results/cpu_attention_kernels.json and cpu_attention_kernels.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import minillm  # noqa: E402
from minillm.attention import cpu_paged, paged_ops  # noqa: E402
from minillm.model.config import ModelConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS, BLOCK = 8, 16
BATCHES, CONTEXTS = (1, 8, 32), (128, 512, 1024)


def caches(config: ModelConfig, batch: int, context: int, scattered: bool, seed: int):
    """8 layers of (q, k_cache, v_cache), and the block tables and context lengths of `batch` sequences."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-context // BLOCK)
    num_blocks = batch * per_seq + 8
    order = torch.randperm(num_blocks, generator=gen) if scattered else torch.arange(num_blocks)
    tables = order[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32)
    shape = (num_blocks, BLOCK, config.num_kv_heads, config.head_dim)
    layers = [(torch.randn(batch, config.num_heads, config.head_dim, generator=gen),
               torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in range(LAYERS)]
    return layers, tables, lens


def measure(config: ModelConfig, batch: int, context: int, scattered: bool, repeats: int) -> dict:
    layers, tables, lens = caches(config, batch, context, scattered, seed=batch * 10_000 + context)
    scale = config.head_dim**-0.5
    ops = {"reference": paged_ops.paged_decode_attention, "kernel": cpu_paged.paged_decode_attention}
    times: dict[str, list[float]] = {name: [] for name in ops}
    outs: dict[str, list[torch.Tensor]] = {}
    for r in range(repeats + 1):  # the first round warms up
        for name in (list(ops) if r % 2 else list(ops)[::-1]):
            start = time.perf_counter()
            outs[name] = [ops[name](q, k, v, tables, lens, scale) for q, k, v in layers]
            if r:
                times[name].append((time.perf_counter() - start) / LAYERS)
    diff = max((a - b).abs().max().item() for a, b in zip(outs["kernel"], outs["reference"]))
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    read = batch * context * config.num_kv_heads * config.head_dim * 4 * 2  # K and V bytes per layer
    return {"batch": batch, "context": context, "blocks": "scattered" if scattered else "consecutive",
            "reference_ms": ms["reference"], "kernel_ms": ms["kernel"], "speedup": ms["reference"] / ms["kernel"],
            "kernel_gb_per_s": read / (ms["kernel"] * 1e-3) / 1e9, "max_abs_diff": diff}


PREFILLS = ((64,), (256,), (512,), (128, 128, 128, 128), (264, 330))


def measure_prefill(config: ModelConfig, lens: tuple[int, ...], repeats: int) -> dict:
    """One prefill step's attention (fresh prompts of `lens` tokens), 8 layers' worth, both ways."""
    gen = torch.Generator().manual_seed(sum(lens))
    width = -(-max(lens) // BLOCK)
    num_blocks = width * len(lens) + 8
    tables = torch.randperm(num_blocks, generator=gen)[: width * len(lens)].view(len(lens), width).to(torch.int32)
    shape = (num_blocks, BLOCK, config.num_kv_heads, config.head_dim)
    tokens = sum(lens)
    rows = torch.tensor([sum(lens[:i]) for i in range(len(lens))], dtype=torch.int32)
    query_lens, starts = torch.tensor(lens, dtype=torch.int32), torch.zeros(len(lens), dtype=torch.int32)
    layers = [(torch.randn(tokens, config.num_heads, config.head_dim, generator=gen),
               torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in range(LAYERS)]
    scale = config.head_dim**-0.5
    ops = {"reference": paged_ops.paged_prefill_attention, "kernel": cpu_paged.paged_prefill_attention}
    times: dict[str, list[float]] = {name: [] for name in ops}
    outs = {name: [torch.zeros_like(q) for q, _, _ in layers] for name in ops}
    for r in range(repeats + 1):  # the first round warms up
        for name in (list(ops) if r % 2 else list(ops)[::-1]):
            start = time.perf_counter()
            for (q, k, v), out in zip(layers, outs[name]):
                ops[name](q, k, v, tables, rows, query_lens, starts, scale, out)
            if r:
                times[name].append((time.perf_counter() - start) / LAYERS)
    diff = max((a - b).abs().max().item() for a, b in zip(outs["kernel"], outs["reference"]))
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    flops = sum(4 * config.num_heads * config.head_dim * n * (n + 1) / 2 for n in lens)
    return {"prompts": list(lens), "reference_ms": ms["reference"], "kernel_ms": ms["kernel"],
            "speedup": ms["reference"] / ms["kernel"], "kernel_gflop_per_s": flops / (ms["kernel"] * 1e-3) / 1e9,
            "max_abs_diff": diff}


def plot(rows: list[dict], prefill: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    labels = [f"{len(r['prompts'])} x {r['prompts'][0]}" if len(set(r["prompts"])) == 1 < len(r["prompts"])
              else " + ".join(map(str, r["prompts"])) for r in prefill]
    axes[2].bar(range(len(prefill)), [r["speedup"] for r in prefill])
    axes[2].set_xticks(range(len(prefill)), labels)
    axes[2].axhline(1.0, color="grey", lw=0.8)
    axes[2].set(title="prefill (fresh prompts, tokens)")
    for ax, blocks in zip(axes, ("consecutive", "scattered")):
        for batch in BATCHES:
            points = [r for r in rows if r["blocks"] == blocks and r["batch"] == batch]
            ax.plot([r["context"] for r in points], [r["speedup"] for r in points], marker="o", label=f"{batch} seqs")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=f"decode, blocks {blocks}", xlabel="context (tokens)", xscale="log")
        ax.legend()
    axes[0].set_ylabel("C kernel's speedup over the torch reference")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default=str(RESULTS / "cpu_attention_kernels"))
    args = parser.parse_args()
    reason = cpu_paged.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"the C kernel cannot run here: {reason}")
    config = minillm.load_model().config
    rows = []
    for scattered in (False, True):
        for batch in BATCHES:
            for context in CONTEXTS:
                row = measure(config, batch, context, scattered, args.repeats)
                rows.append(row)
                print(f"{row['blocks']:>11} {batch:3d} seqs x {context:5d} tokens: reference "
                      f"{row['reference_ms']:.3f} ms, kernel {row['kernel_ms']:.3f} ms ({row['speedup']:.1f}x, "
                      f"{row['kernel_gb_per_s']:.1f} GB/s), max |diff| {row['max_abs_diff']:.1e}", flush=True)
    prefill = []
    for lens in PREFILLS:
        row = measure_prefill(config, lens, args.repeats)
        prefill.append(row)
        print(f"prefill {' + '.join(map(str, lens)):>21} tokens: reference {row['reference_ms']:.3f} ms, kernel "
              f"{row['kernel_ms']:.3f} ms ({row['speedup']:.1f}x, {row['kernel_gflop_per_s']:.0f} GFLOP/s), "
              f"max |diff| {row['max_abs_diff']:.1e}", flush=True)
    out = Path(args.out)
    meta = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "shape": {"heads": config.num_heads, "kv_heads": config.num_kv_heads,
                                                   "head_dim": config.head_dim}, "layers": LAYERS}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "decode": rows, "prefill": prefill}, indent=1))
    plot(rows, prefill, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
