"""Chapter 5 benchmark: the same paged engine with and without the prefix cache, in one run.

    python benchmarks/prefix_cache.py [--requests 64] [--repeats 3] [--loads 0.25 0.5 0.75]
    python benchmarks/prefix_cache.py --plot-only      (redraw the plot from the saved JSON)

Three workloads on the shipped target, greedy, ignore_eos, fixed seed; prompts cut from held-out
Shakespeare (minillm/assets/heldout_sample.txt):
  shared-system-prompt  --requests requests: one system prompt of 400 tokens + a distinct question of
                        20 tokens each, 32 new tokens
  multi-turn-chat       8 conversations x 4 turns: each turn's prompt is the whole conversation so
                        far (earlier lines and answers) plus a new line of ~30 tokens; 48 new tokens;
                        the 8 conversations' turn k arrive together, turn k+1 after all of turn k
  no-shared-prefix      --requests prompts of 420 tokens, each starting at a different place of the
                        text: the cost of looking up blocks that are never there
Each streamed workload (the first and the last) runs in two regimes:
  saturated   one request arrives every --arrive-every engine steps, which keeps all 16 slots busy:
              output tok/s here is what the engine can sustain (requests admitted in the same step
              could not share anyway: a block is cached once its K/V are computed)
  served      requests arrive on a seeded Poisson clock at a fixed rate in requests per second, the
              same arrival times for both engines, as a server's clients would send them; the rate
              is --loads x the request rate the engine *without* the cache sustained saturated
              (measured first, in the same run). TTFT here is what a user waits at that load.
Engines: EngineConfig(kv="paged", block_size=16, max_num_seqs=16), prefix_cache False / True, one
model in memory. Saturated runs repeat --repeats times alternating the engines, the fastest counts;
served runs go once per load (a p50 over --requests requests). Every run starts from an empty cache
and outputs are asserted identical. Results: benchmarks/results/prefix_cache.json and .png.
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
          "no-shared-prefix": "no shared\nprefix"}
HEADLINE_LOAD = 0.5  # the served load the summary table reports


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


def run_saturated(engine: LLMEngine, prompts: list[list[int]], new_tokens: int, every: int) -> list:
    """One request arrives every `every` engine steps; returns the outputs in order."""
    pending, ids, step = list(prompts), [], 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            ids.append(engine.add_request(pending.pop(0), greedy(new_tokens)).request_id)
        engine.step()
        step += 1
    return [engine.output(i) for i in ids]


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of `count` requests at `rate` per second on average."""
    rng, t, offsets = random.Random(seed), 0.0, []
    for _ in range(count):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def run_served(engine: LLMEngine, prompts: list[list[int]], new_tokens: int, offsets: list[float]) -> list:
    """Each request arrives at its wall-clock time, whatever the engine is doing; TTFT counts from then."""
    start = time.perf_counter()
    arrivals, ids = [start + o for o in offsets], []
    while len(ids) < len(prompts) or engine.has_unfinished():
        now = time.perf_counter()
        while len(ids) < len(prompts) and arrivals[len(ids)] <= now:
            i = len(ids)
            ids.append(engine.add_request(prompts[i], greedy(new_tokens), arrival_time=arrivals[i]).request_id)
        if engine.has_unfinished():
            engine.step()
        else:  # idle until the next arrival
            time.sleep(max(0.0, arrivals[len(ids)] - time.perf_counter()))
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
    return {"wall_s": wall, "requests_per_s": len(outputs) / wall, "output_tok_per_s": stats["output_tokens_per_s"],
            "ttft_p50_s": stats["ttft_s"]["p50"], "ttft_p99_s": stats["ttft_s"]["p99"],
            "prompt_tokens": prompt_tokens, "cached_prompt_tokens": sum(o.num_cached_tokens for o in outputs),
            "cached_share": sum(o.num_cached_tokens for o in outputs) / prompt_tokens,
            "outputs": [o.token_ids for o in outputs]}


def compare(model, tokenizer, workload, repeats: int) -> dict:
    """Both engines on one workload, `repeats` times alternating (so both see the same machine); the
    fastest run of each counts. Outputs must be identical."""
    runs = {name: [] for name in SYSTEMS}
    for _ in range(repeats):
        for name, prefix_cache in SYSTEMS.items():
            runs[name].append(measure(model, tokenizer, prefix_cache, workload))
    best = {name: max(measured, key=lambda m: m["output_tok_per_s"]) for name, measured in runs.items()}
    plain, cached = best.values()
    assert plain["outputs"] == cached["outputs"], "outputs differ with and without the prefix cache"
    return {name: {k: v for k, v in m.items() if k != "outputs"} for name, m in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arrive-every", type=int, default=2, help="engine steps between two saturated arrivals")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                        help="served rates, as fractions of the saturated request rate without the cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS / "prefix_cache.json").read_text()), RESULTS / "prefix_cache.png")
        return
    loads = sorted(set(args.loads) | {HEADLINE_LOAD})
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    text = Text(tokenizer, args.seed)
    (system,) = text.spans(1, 400)
    streamed = {"shared-system-prompt": [system + question for question in text.spans(args.requests, 20)],
                "no-shared-prefix": text.spans(args.requests, 420)}
    openings, lines = text.spans(8, 24), [text.spans(4, 30) for _ in range(8)]
    results = []
    for name, prompts in streamed.items():
        saturated = compare(model, tokenizer, lambda e, p=prompts: run_saturated(e, p, 32, args.arrive_every),
                            args.repeats)
        capacity = saturated["no prefix cache"]["requests_per_s"]
        served = []
        for load in loads if name == "shared-system-prompt" else [HEADLINE_LOAD]:
            offsets = poisson_offsets(len(prompts), load * capacity, args.seed)
            rows = compare(model, tokenizer, lambda e, p=prompts, o=offsets: run_served(e, p, 32, o), 1)
            served.append({"load": load, "rate_per_s": load * capacity, "rows": rows})
            print(f"{name:22s} served at {load:.2f} x {capacity:.2f} req/s: TTFT p50 "
                  + " -> ".join(f"{r['ttft_p50_s'] * 1e3:.0f}" for r in rows.values()) + " ms")
        results.append(summarise(name, saturated, served))
    chat = compare(model, tokenizer, lambda e: run_chat(e, openings, lines, 48), args.repeats)
    results.append(summarise("multi-turn-chat", chat, []))
    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "requests": args.requests, "repeats": args.repeats, "seed": args.seed, "block_size": 16,
            "max_num_seqs": 16, "saturated_arrive_every_steps": args.arrive_every, "served_loads": loads,
            "headline_load": HEADLINE_LOAD, "outputs_identical": True}
    saved = {"meta": meta, "results": results}
    (RESULTS / "prefix_cache.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, RESULTS / "prefix_cache.png")
    print(f"wrote {RESULTS / 'prefix_cache.json'} and prefix_cache.png")


def summarise(name: str, saturated: dict, served: list[dict]) -> dict:
    """One workload's headline ratios: cache share and tok/s from the saturated (or chat) runs, TTFT from
    the served run at HEADLINE_LOAD (the chat's own turns where there is none)."""
    plain, cached = saturated.values()
    headline = next((s["rows"] for s in served if s["load"] == HEADLINE_LOAD), saturated)
    ttft_plain, ttft_cached = (row["ttft_p50_s"] for row in headline.values())
    ratios = {"cached_share": cached["cached_share"], "ttft_p50_plain_s": ttft_plain,
              "ttft_p50_cached_s": ttft_cached, "ttft_p50_speedup": ttft_plain / ttft_cached,
              "tok_per_s_cache_vs_none": cached["output_tok_per_s"] / plain["output_tok_per_s"]}
    print(f"{name:22s} cached {ratios['cached_share']:5.1%} of prompt tokens, TTFT p50 {ttft_plain * 1e3:.0f} -> "
          f"{ttft_cached * 1e3:.0f} ms ({ratios['ttft_p50_speedup']:.1f}x), saturated tok/s "
          f"{plain['output_tok_per_s']:.0f} -> {cached['output_tok_per_s']:.0f} "
          f"({ratios['tok_per_s_cache_vs_none']:.3f}x)")
    return {"workload": name, "saturated": saturated, "served": served, "ratios": ratios}


def plot(saved: dict, path: Path) -> None:
    """Left: per workload, prompt tokens from the cache, TTFT p50 (served at the headline load; the chat at
    its own turns) and saturated output tok/s. Right: the shared system prompt's TTFT against the load."""
    results = saved["results"]
    names = [r["workload"] for r in results]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.9))
    load = saved["meta"]["headline_load"]
    panels = [("share of prompt tokens served from the cache", "cached_share", 100, "%"),
              (f"TTFT p50, served at {load:g}x load\n(lower is better)", "ttft", 1e3, "ms"),
              ("output tokens / s, saturated\n(higher is better)", "output_tok_per_s", 1, "tok/s")]
    for ax, (title, key, scale, unit) in zip(axes, panels):
        for k, (system, colour) in enumerate(zip(SYSTEMS, ("#999", "#2a7"))):
            if key == "ttft":
                values = [scale * r["ratios"]["ttft_p50_plain_s" if k == 0 else "ttft_p50_cached_s"] for r in results]
            else:
                values = [scale * r["saturated"][system][key] for r in results]
            bars = ax.bar([i + (k - 0.5) * 0.38 for i in range(len(names))], values, width=0.38, color=colour,
                          label=system)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(names)), [LABELS.get(n, n) for n in names], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
    axes[0].legend(fontsize=8)
    sweep = next(r for r in results if r["workload"] == "shared-system-prompt")["served"]
    ax = axes[3]
    for system, colour in zip(SYSTEMS, ("#999", "#2a7")):
        ax.plot([s["rate_per_s"] for s in sweep], [1e3 * s["rows"][system]["ttft_p50_s"] for s in sweep], "o-",
                color=colour, label=system)
    ax.set(xlabel="requests per second (Poisson arrivals)", ylabel="ms", ylim=(0, None))
    ax.set_title("shared system prompt: TTFT p50\nagainst the request rate", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
