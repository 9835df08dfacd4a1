"""What a pass's block tables cost the host: kept between passes, against written afresh every pass.

    python benchmarks/block_tables.py [--steps 64] [--rounds 5]
    python benchmarks/block_tables.py --plot-only

For decode steps of a paged cache (16-token blocks) at three batch shapes — 32 sequences at 300 tokens,
64 at 2,048, 256 at 1,024 — the time `PagedKVCache.batch` takes to build one pass's metadata (slot
mapping, positions, decode block tables), every sequence advancing one token per step so that a table
grows a block every 16 steps:

    kept     the cache's tables kept as tensor rows between passes (minillm/attention/block_table_rows.py):
             a pass writes only what changed
    afresh   the same, with the kept rows forgotten before every pass: every entry of every table written
             (one indexed write, as for a sequence new to its row) — about what every pass cost when it built
             its tables from Python lists (measured from the commit before the rows were kept, on the course's
             2-core machine: 0.13-0.18, 0.93-1.26 and 2.0 ms on these shapes)

Each round times both ways, alternating, over --steps steps each; a way's figure is its median step,
the ratio the median over rounds of afresh / kept. Results: benchmarks/results/block_tables.json, .png.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from minillm.attention.block_table_rows import BlockTableRows  # noqa: E402
from minillm.attention.paged import PagedKVCache  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [(32, 300), (64, 2048), (256, 1024)]  # (sequences, context tokens)
BLOCK = 16


def time_steps(num_seqs: int, context: int, steps: int, afresh: bool) -> float:
    """Median ms of `cache.batch` over `steps` decode steps of `num_seqs` sequences from `context` tokens."""
    per_seq = -(-(context + steps + 1) // BLOCK)
    cache = PagedKVCache(1, num_seqs * per_seq, BLOCK, 1, 8)
    rows, lens, times = list(range(num_seqs)), [1] * num_seqs, []
    for step in range(steps):
        position = context + step
        tables = [tuple(range(i * per_seq, i * per_seq + position // BLOCK + 1)) for i in range(num_seqs)]
        if afresh:
            cache.table_rows = BlockTableRows(cache.num_blocks, "cpu")
        start = time.perf_counter()
        cache.batch(tables, [position] * num_seqs, lens, rows=rows)
        times.append(time.perf_counter() - start)
    return median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    path = RESULTS / "block_tables.json"
    if args.plot_only:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    torch.set_num_threads(1)
    results = []
    for num_seqs, context in SHAPES:
        kept, afresh = [], []
        for round_ in range(args.rounds):
            for way in (("kept", "afresh") if round_ % 2 == 0 else ("afresh", "kept")):
                (kept if way == "kept" else afresh).append(time_steps(num_seqs, context, args.steps, way == "afresh"))
        ratio = median(a / k for a, k in zip(afresh, kept))
        results.append({"sequences": num_seqs, "context": context, "kept_ms": median(kept),
                        "afresh_ms": median(afresh), "afresh_over_kept": ratio})
        print(f"{num_seqs:4d} sequences x {context:5d} tokens: kept {median(kept):.3f} ms, afresh "
              f"{median(afresh):.3f} ms per pass ({ratio:.2f}x)")
    saved = {"machine": f"{platform.machine()}, torch {torch.__version__}, 1 thread", "block_size": BLOCK,
             "steps": args.steps, "rounds": args.rounds, "shapes": results}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(saved, indent=1) + "\n")
    plot(saved, path.with_suffix(".png"))


def plot(saved: dict, path: Path) -> None:
    shapes = saved["shapes"]
    labels = [f"{s['sequences']} x {s['context']}" for s in shapes]
    x = range(len(shapes))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar([i - 0.2 for i in x], [s["afresh_ms"] for s in shapes], width=0.4, label="every table written afresh",
           color="#bbb")
    ax.bar([i + 0.2 for i in x], [s["kept_ms"] for s in shapes], width=0.4, label="tables kept between passes",
           color="#4c78a8")
    for i, s in enumerate(shapes):
        ax.annotate(f"{s['afresh_over_kept']:.1f}x", (i, max(s["afresh_ms"], s["kept_ms"])), ha="center",
                    va="bottom", fontsize=8)
    ax.set(xticks=list(x), xticklabels=labels, xlabel="decoding sequences x context tokens",
           ylabel="ms per pass (host)", title="A decode pass's attention metadata: PagedKVCache.batch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
