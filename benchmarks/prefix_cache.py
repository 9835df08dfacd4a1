"""Chapter 5 benchmark: the same paged engine with and without the prefix cache, in one run.

    python benchmarks/prefix_cache.py [--requests 64] [--repeats 3] [--arrive-every 2] [--light-every 6]
    python benchmarks/prefix_cache.py --plot-only      (redraw the plot from the saved JSON)

Four workloads on the shipped target, greedy, ignore_eos, fixed seed; prompts cut from held-out
Shakespeare (minillm/assets/heldout_sample.txt):
  shared-system-prompt  --requests requests: one system prompt of 400 tokens + a distinct question of
                        20 tokens each, 32 new tokens; one request arrives every --arrive-every engine
                        steps, as a server's requests would (requests admitted in the same step cannot
                        share: a block is cached once its K/V are computed)
  shared-system-prompt-light-load   the same requests, one every --light-every steps: fewer decodes share
                        each step, so TTFT is closer to the prefill alone
  multi-turn-chat       8 conversations x 4 turns: each turn's prompt is the whole conversation so
                        far (earlier lines and answers) plus a new line of ~30 tokens; 48 new tokens;
                        the 8 conversations' turn k arrive together, turn k+1 after all of turn k
  no-shared-prefix      --requests prompts of 420 tokens, each starting at a different place of the text,
                        arriving like the first workload:
                        the cost of looking up blocks that are never there
Engines: EngineConfig(kv="paged", block_size=16, max_num_seqs=16), prefix_cache False / True, one
model in memory. Each (workload, engine) pair runs --repeats times, alternating; the fastest run
counts for throughput, and each run starts from an empty cache. Outputs are asserted identical.
Measured: share of prompt tokens served from the cache, TTFT p50, output tok/s. Results go to
benchmarks/results/prefix_cache.json and prefix_cache.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import minillm  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLMEngine  # noqa: E402
from minillm.metrics import summarize  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = {"no prefix cache": False, "prefix cache": True}
LABELS = {"shared-system-prompt": "shared system\nprompt", "multi-turn-chat": "multi-turn\nchat",
          "shared-system-prompt-light-load": "shared prompt,\nlight load", "no-shared-prefix": "no shared\nprefix"}


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


class Text:
    """Random spans of the held-out text, as token ids."""

    def __init__(self, tokenizer, seed: int):
        self.ids = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
        self.rng = random.Random(seed)

    def spans(self, count: int, length: int) -> list[list[int]]:
        """`count` spans of `length` tokens, each starting at a different place (the text is ~1,200 tokens,
        so spans overlap, but no two start at the same position)."""
        starts = self.rng.sample(range(len(self.ids) - length), count)
        return [self.ids[start : start + length] for start in starts]


def run_streamed(engine: LLMEngine, prompts: list[list[int]], new_tokens: int, every: int) -> list:
    """One request arrives every `every` engine steps; returns the outputs in order."""
    pending, ids, step = list(prompts), [], 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            ids.append(engine.add_request(pending.pop(0), greedy(new_tokens)).request_id)
        engine.step()
        step += 1
    return [engine.output(i) for i in ids]


def run_chat(engine: LLMEngine, openings: list[list[int]], lines: list[list[list[int]]], new_tokens: int) -> list:
    """Turn by turn: every conversation's next prompt is its history plus its next line."""
    history, outputs = [list(o) for o in openings], []
    for turn in range(len(lines[0])):
        ids = []
        for c, line in enumerate(lines):
            history[c] += line[turn]
            ids.append(engine.add_request(list(history[c]), greedy(new_tokens)).request_id)
        while engine.has_unfinished():
            engine.step()
        for c, request_id in enumerate(ids):
            out = engine.output(request_id)
            history[c] += out.token_ids
            outputs.append(out)
    return outputs


def measure(model, tokenizer, prefix_cache: bool, workload) -> dict:
    engine = LLMEngine(model, tokenizer, EngineConfig(kv="paged", block_size=16, max_num_seqs=16,
                                                      prefix_cache=prefix_cache))
    start = time.perf_counter()
    outputs = workload(engine)
    wall = time.perf_counter() - start
    stats = summarize([o.metrics for o in outputs], wall_time=wall)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {"wall_s": wall, "output_tok_per_s": stats["output_tokens_per_s"], "ttft_p50_s": stats["ttft_s"]["p50"],
            "ttft_p99_s": stats["ttft_s"]["p99"], "prompt_tokens": prompt_tokens,
            "cached_prompt_tokens": sum(o.num_cached_tokens for o in outputs),
            "cached_share": sum(o.num_cached_tokens for o in outputs) / prompt_tokens,
            "outputs": [o.token_ids for o in outputs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arrive-every", type=int, default=2, help="engine steps between two arrivals")
    parser.add_argument("--light-every", type=int, default=6, help="the same, for the light-load workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS / "prefix_cache.json").read_text())["results"], RESULTS / "prefix_cache.png")
        return
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    text = Text(tokenizer, args.seed)
    (system,) = text.spans(1, 400)
    shared = [system + question for question in text.spans(args.requests, 20)]
    distinct = text.spans(args.requests, 420)
    openings = text.spans(8, 24)
    lines = [text.spans(4, 30) for _ in range(8)]
    every = args.arrive_every
    workloads = {
        "shared-system-prompt": lambda engine: run_streamed(engine, shared, 32, every),
        "shared-system-prompt-light-load": lambda engine: run_streamed(engine, shared, 32, args.light_every),
        "multi-turn-chat": lambda engine: run_chat(engine, openings, lines, 48),
        "no-shared-prefix": lambda engine: run_streamed(engine, distinct, 32, every),
    }
    results = []
    for name, workload in workloads.items():
        runs = {system_name: [] for system_name in SYSTEMS}
        for _ in range(args.repeats):
            for system_name, prefix_cache in SYSTEMS.items():  # alternating, so both see the same machine
                runs[system_name].append(measure(model, tokenizer, prefix_cache, workload))
        rows = []
        for system_name, measured in runs.items():
            best = max(measured, key=lambda m: m["output_tok_per_s"])
            row = {"system": system_name, **{k: v for k, v in best.items() if k != "outputs"},
                   "ttft_p50_s_median_of_runs": sorted(m["ttft_p50_s"] for m in measured)[len(measured) // 2]}
            rows.append((row, best["outputs"]))
        (plain, plain_out), (cached, cached_out) = rows
        assert plain_out == cached_out, f"{name}: outputs differ with and without the prefix cache"
        ratios = {"cached_share": cached["cached_share"],
                  "ttft_p50_speedup": plain["ttft_p50_s"] / cached["ttft_p50_s"],
                  "tok_per_s_cache_vs_none": cached["output_tok_per_s"] / plain["output_tok_per_s"]}
        results.append({"workload": name, "requests": len(cached_out), "rows": [plain, cached], "ratios": ratios})
        print(f"{name:32s} cached {ratios['cached_share']:5.1%} of prompt tokens, TTFT p50 "
              f"{plain['ttft_p50_s'] * 1e3:6.0f} -> {cached['ttft_p50_s'] * 1e3:5.0f} ms "
              f"({ratios['ttft_p50_speedup']:.1f}x), tok/s {ratios['tok_per_s_cache_vs_none']:.3f}x")
    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "requests": args.requests, "repeats": args.repeats, "seed": args.seed, "block_size": 16,
            "arrive_every_steps": every, "light_load_arrive_every_steps": args.light_every,
            "max_num_seqs": 16, "outputs_identical": True}
    (RESULTS / "prefix_cache.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    plot(results, RESULTS / "prefix_cache.png")
    print(f"wrote {RESULTS / 'prefix_cache.json'} and prefix_cache.png")


def plot(results: list[dict], path: Path) -> None:
    """Three panels, one bar pair per workload: prompt tokens from the cache, TTFT p50, output tok/s."""
    names = [r["workload"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    panels = [("share of prompt tokens served from the cache", lambda row: 100 * row["cached_share"], "%"),
              ("TTFT p50 (lower is better)", lambda row: 1e3 * row["ttft_p50_s"], "ms"),
              ("output tokens / s (higher is better)", lambda row: row["output_tok_per_s"], "tok/s")]
    for ax, (title, value, unit) in zip(axes, panels):
        for k, (system, colour) in enumerate(zip(SYSTEMS, ("#999", "#2a7"))):
            values = [value(r["rows"][k]) for r in results]
            bars = ax.bar([i + (k - 0.5) * 0.38 for i in range(len(names))], values, width=0.38, color=colour,
                          label=system)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(names)), [LABELS.get(n, n) for n in names], fontsize=8)
        ax.set(title=title, ylabel=unit)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
