"""Where an extend's attention should split (minillm/attention/causal.py::SPLIT_FROM), measured on CPU.

    python benchmarks/causal_split.py [--repeats 15]

An extend of n new tokens after `start` cached ones attends a rectangle (every new token sees every
cached one) plus a triangle (the new tokens causally). One masked call computes the whole
(n, start + n) score matrix, its masked corner included; the split attends the two parts apart and
merges them by their log-sum-exps. The split's second call and merge cost about the same whatever
the size, the masked call's waste grows with its score matrix, n x (start + n) per head: so the
engine splits from `SPLIT_FROM` scores on. This script times both (each the fastest of `--repeats`
calls, the two alternated) on the shipped model's attention shape, for contexts of 64 to 2048 cached
tokens and 2 to 512 new ones, checks they agree, and reports how much the rule loses against the
faster path at each point (a share of the corner, (n - 1) / (2 (start + n)), is saved beside it).
Results: benchmarks/results/causal_split.json and causal_split.png.
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
import torch.nn.functional as F  # noqa: E402

import minillm  # noqa: E402
from minillm.attention import causal  # noqa: E402
from minillm.model.config import ModelConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STARTS = (64, 256, 1024, 2048)
NEW = (2, 4, 8, 16, 32, 64, 128, 256, 512)


def masked(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """The one-call path: the whole score matrix, the corner masked."""
    n, end = q.shape[2], keys.shape[2]
    visible = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start)  # (n, end)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale, enable_gqa=True)


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(heads: int, kv_heads: int, head_dim: int, start: int, n: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(start * 1000 + n)
    q = torch.randn(1, heads, n, head_dim, generator=gen)
    keys = torch.randn(1, kv_heads, start + n, head_dim, generator=gen)
    values = torch.randn(1, kv_heads, start + n, head_dim, generator=gen)
    scale = head_dim**-0.5
    one, two = (lambda: masked(q, keys, values, start, scale)), (lambda: causal._split_extend(q, keys, values, start,
                                                                                                scale))
    diff = (one() - two()).abs().max().item()
    times = {"masked_s": float("inf"), "split_s": float("inf")}
    for _ in range(3):  # alternate, so a burst of other work lands on both
        times["masked_s"] = min(times["masked_s"], fastest(one, repeats))
        times["split_s"] = min(times["split_s"], fastest(two, repeats))
    share = (n - 1) / (2 * (start + n))
    return {"start": start, "new": n, "scores": n * (start + n), "corner_share": share, **times,
            "masked_over_split": times["masked_s"] / times["split_s"], "max_abs_diff": diff}


def rule_cost(row: dict, split_from: int) -> float:
    """How much slower the path the rule takes was than the faster of the two (1.0: the faster one)."""
    taken = row["split_s"] if row["scores"] >= split_from else row["masked_s"]
    return taken / min(row["split_s"], row["masked_s"])


def plot(saved: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    for start in saved["meta"]["starts"]:
        rows = sorted((r for r in saved["rows"] if r["start"] == start), key=lambda r: r["scores"])
        ax.plot([r["scores"] for r in rows], [r["masked_over_split"] for r in rows], marker="o",
                label=f"{start} cached tokens")
    ax.axhline(1, color="#888", lw=1)
    ax.axvline(saved["meta"]["split_from_in_code"], color="k", ls="--", lw=1,
               label=f"SPLIT_FROM = {saved['meta']['split_from_in_code']} scores (minillm/attention/causal.py)")
    ax.set(xscale="log", xlabel="scores per head, n x (start + n), log scale",
           ylabel="masked time / split time", title="above 1 the split is faster")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and the plot")
    args = parser.parse_args()
    config = ModelConfig.from_hf(json.loads((minillm.ASSETS_DIR / "target" / "config.json").read_text()))
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    rows = []
    for start in STARTS:
        for n in NEW:
            rows.append(measure(heads, kv_heads, head_dim, start, n, args.repeats))
            r = rows[-1]
            print(f"start {start:5d} new {n:4d}  corner {r['corner_share']:.3f}  masked {r['masked_s'] * 1e6:8.0f} µs"
                  f"  split {r['split_s'] * 1e6:8.0f} µs  ({r['masked_over_split']:.2f}x)")
    assert all(r["max_abs_diff"] < 1e-4 for r in rows), "the split and the masked call disagree"
    costs = [rule_cost(r, causal.SPLIT_FROM) for r in rows]
    worst = rows[max(range(len(rows)), key=costs.__getitem__)]
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "starts": list(STARTS), "new": list(NEW),
            "repeats": args.repeats, "split_from_in_code": causal.SPLIT_FROM,
            "rule_cost_worst": max(costs), "rule_cost_median": sorted(costs)[len(costs) // 2],
            "rule_cost_worst_at": {"start": worst["start"], "new": worst["new"]}}
    saved = {"meta": meta, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "causal_split.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, args.out / "causal_split.png")
    print(f"SPLIT_FROM = {causal.SPLIT_FROM} scores takes the faster path or one at most {max(costs):.2f}x as slow "
          f"(at {worst['new']} new tokens after {worst['start']}; median {meta['rule_cost_median']:.2f}x); "
          f"wrote {args.out / 'causal_split.json'} and causal_split.png")


if __name__ == "__main__":
    main()
