"""Chapter 6 benchmark: the same paged engine with and without chunked prefill, in one run.

    python benchmarks/chunked_prefill.py [--decoders 12] [--long-prompts 4] [--chunks 32 64 128 256 512]
    python benchmarks/chunked_prefill.py --plot-only      (redraw the plot from the saved JSON)
    python benchmarks/chunked_prefill.py --out /tmp/check  (write the results elsewhere: a trial run)

Workload (shipped target, greedy, ignore_eos): --decoders requests with short prompts (24 tokens)
arrive at once and decode --decode-tokens tokens each; meanwhile --long-prompts prompts of
--prompt-len tokens (cut from the held-out text, repeated) arrive on a wall clock, one every --every
seconds from 0.5 s, and generate 8 tokens each. The arrival times are the same for every engine.

Measured per engine: ITL p50 / p99 of the decoding requests (the stall a long prefill causes them),
TTFT of the long prompts, and total output tokens per second. Engines: EngineConfig(kv="paged",
block_size=16, max_num_seqs=16) unchunked (a prompt in one step), and chunked_prefill=True with
max_tokens_per_prefill_chunk in --chunks (the headline is the course default). Every engine runs
--repeats times, alternating; each engine's row is its least disturbed run (the shortest wall time),
all its metrics from that one run; the headline ratios are medians over the repeats of the ratio
within each repeat. Outputs are asserted identical.
Results: benchmarks/results/chunked_prefill.json and .png.
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

import minillm  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLMEngine  # noqa: E402
from minillm.metrics import percentile  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_CHUNK = EngineConfig().max_tokens_per_prefill_chunk


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def workload(tokenizer, args) -> list[tuple[float, list[int], int, str]]:
    """(arrival offset in seconds, prompt, new tokens, kind) per request, sorted by arrival."""
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    long_text = (text * (1 + args.prompt_len // len(text)))
    requests = [(0.0, text[24 * i : 24 * (i + 1)], args.decode_tokens, "decoder") for i in range(args.decoders)]
    for k in range(args.long_prompts):  # each starts at a different place, so no two are alike
        start = 97 * k
        requests.append((0.5 + k * args.every, long_text[start : start + args.prompt_len], 8, "long prompt"))
    return requests


def run(engine: LLMEngine, requests) -> tuple[list, float]:
    """Serve `requests` on their wall-clock arrivals; returns the outputs (in request order) and the wall time."""
    start = time.perf_counter()
    ids: list[str] = []
    while len(ids) < len(requests) or engine.has_unfinished():
        now = time.perf_counter()
        while len(ids) < len(requests) and start + requests[len(ids)][0] <= now:
            offset, prompt, n, _ = requests[len(ids)]
            ids.append(engine.add_request(prompt, greedy(n), arrival_time=start + offset).request_id)
        if engine.has_unfinished():
            engine.step()
        else:
            time.sleep(max(0.0, start + requests[len(ids)][0] - time.perf_counter()))
    return [engine.output(i) for i in ids], time.perf_counter() - start


def measure(model, tokenizer, chunk: int | None, requests) -> dict:
    config = EngineConfig(kv="paged", block_size=16, max_num_seqs=16, max_model_len=2048,
                          chunked_prefill=chunk is not None, max_tokens_per_prefill_chunk=chunk or DEFAULT_CHUNK)
    outputs, wall = run(LLMEngine(model, tokenizer, config), requests)
    itls = [x for o, r in zip(outputs, requests) if r[3] == "decoder" for x in o.metrics.itls]
    long_ttfts = [o.metrics.ttft for o, r in zip(outputs, requests) if r[3] == "long prompt"]
    return {"itl_p50_s": percentile(itls, 50), "itl_p99_s": percentile(itls, 99), "itl_max_s": max(itls),
            "long_prompt_ttft_p50_s": percentile(long_ttfts, 50), "wall_s": wall,
            "output_tok_per_s": sum(len(o.token_ids) for o in outputs) / wall,
            "outputs": [o.token_ids for o in outputs]}


def least_disturbed(runs: list[dict]) -> dict:
    """The repeat with the shortest wall time, every metric from that same run (noise only ever makes a
    run slower; mixing the best of each metric from different runs would describe no real run)."""
    fastest = min(runs, key=lambda r: r["wall_s"])
    return {k: v for k, v in fastest.items() if k != "outputs"}


def paired_ratios(plain: list[dict], chunked: list[dict]) -> dict:
    """Chunked against unchunked, each ratio the median over the repeats of the ratio within one repeat
    (the two engines ran back to back there, so a slow spell of the machine touches both)."""
    def median_ratio(key: str, invert: bool = False) -> float:
        values = [(p[key] / c[key]) if invert else (c[key] / p[key]) for p, c in zip(plain, chunked)]
        return percentile(values, 50)

    return {"itl_p99_unchunked_vs_chunked": median_ratio("itl_p99_s", invert=True),
            "tok_per_s_chunked_vs_unchunked": median_ratio("output_tok_per_s"),
            "long_prompt_ttft_chunked_vs_unchunked": median_ratio("long_prompt_ttft_p50_s"),
            "repeats": len(plain)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoders", type=int, default=12)
    parser.add_argument("--decode-tokens", type=int, default=200)
    parser.add_argument("--long-prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=1500)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between two long prompts")
    parser.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and the plot")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((args.out / "chunked_prefill.json").read_text()), args.out / "chunked_prefill.png")
        return
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    requests = workload(tokenizer, args)
    chunks = sorted(set(args.chunks) | {DEFAULT_CHUNK})
    systems: dict[str, int | None] = {"unchunked": None} | {f"chunk {c}": c for c in chunks}
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    for _ in range(args.repeats):
        for name, chunk in systems.items():
            runs[name].append(measure(model, tokenizer, chunk, requests))
            m = runs[name][-1]
            print(f"{name:10s} ITL p50 {m['itl_p50_s'] * 1e3:5.1f} ms  p99 {m['itl_p99_s'] * 1e3:6.1f} ms  long-prompt "
                  f"TTFT {m['long_prompt_ttft_p50_s'] * 1e3:6.0f} ms  {m['output_tok_per_s']:5.0f} tok/s")
    reference = runs["unchunked"][0]["outputs"]
    assert all(r["outputs"] == reference for rs in runs.values() for r in rs), "outputs differ between engines"
    rows = {name: least_disturbed(rs) | {"max_tokens_per_prefill_chunk": systems[name]} for name, rs in runs.items()}
    ratios = paired_ratios(runs["unchunked"], runs[f"chunk {DEFAULT_CHUNK}"])
    print(f"chunk {DEFAULT_CHUNK}: ITL p99 {ratios['itl_p99_unchunked_vs_chunked']:.1f}x lower, tok/s "
          f"{ratios['tok_per_s_chunked_vs_unchunked']:.3f}x, long-prompt TTFT "
          f"{ratios['long_prompt_ttft_chunked_vs_unchunked']:.2f}x")
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "decoders": args.decoders, "decode_tokens": args.decode_tokens, "long_prompts": args.long_prompts,
            "prompt_len": args.prompt_len, "every_s": args.every, "repeats": args.repeats,
            "default_chunk": DEFAULT_CHUNK, "block_size": 16, "max_num_seqs": 16, "outputs_identical": True}
    every_run = {name: [{k: v for k, v in r.items() if k != "outputs"} for r in rs] for name, rs in runs.items()}
    saved = {"meta": meta, "rows": rows, "ratios": ratios, "runs": every_run}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chunked_prefill.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, args.out / "chunked_prefill.png")
    print(f"wrote {args.out / 'chunked_prefill.json'} and chunked_prefill.png")


def plot(saved: dict, path: Path) -> None:
    """Left: ITL p50 / p99 of the decoding requests, unchunked vs the default chunk. Middle: against the
    chunk size, the decoders' p99 ITL and the long prompts' TTFT (unchunked dashed). Right: output tok/s."""
    rows, default = saved["rows"], saved["meta"]["default_chunk"]
    plain, chunked = rows["unchunked"], rows[f"chunk {default}"]
    sweep = sorted((r["max_tokens_per_prefill_chunk"], r) for r in rows.values() if r["max_tokens_per_prefill_chunk"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    for k, (label, row, colour) in enumerate([("unchunked", plain, "#999"), (f"chunks of {default}", chunked, "#2a7")]):
        bars = ax.bar([i + (k - 0.5) * 0.38 for i in range(2)], [row["itl_p50_s"] * 1e3, row["itl_p99_s"] * 1e3],
                      width=0.38, color=colour, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([0, 1], ["ITL p50", "ITL p99"])
    ax.set(ylabel="ms", title="decoding requests' inter-token latency\n(lower is better)")
    ax.legend(fontsize=8)
    ax = axes[1]
    sizes = [c for c, _ in sweep]
    ax.plot(sizes, [r["itl_p99_s"] * 1e3 for _, r in sweep], "o-", color="#2a7", label="ITL p99, decoders")
    ax.axhline(plain["itl_p99_s"] * 1e3, color="#2a7", ls="--", lw=1.2, label="ITL p99, unchunked")
    ax.plot(sizes, [r["long_prompt_ttft_p50_s"] * 1e3 for _, r in sweep], "s-", color="#c60",
            label="TTFT p50, long prompts")
    ax.axhline(plain["long_prompt_ttft_p50_s"] * 1e3, color="#c60", ls=":", lw=1.6, label="TTFT p50, unchunked")
    # the two unchunked lines often lie close together: the lower one's label goes under it, the higher
    # one's over it, so that they never crowd each other whatever the figures
    lines = sorted([(plain["itl_p99_s"] * 1e3, "ITL p99 unchunked", "#2a7"),
                    (plain["long_prompt_ttft_p50_s"] * 1e3, "TTFT unchunked", "#c60")])
    for (y, label, colour), (dy, va) in zip(lines, [(-3, "top"), (3, "bottom")]):
        ax.annotate(f"{label} {y:.0f} ms", (sizes[0], y), xytext=(2, dy), textcoords="offset points", fontsize=7,
                    color=colour, ha="left", va=va)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set(xlabel="max_tokens_per_prefill_chunk", ylabel="ms", ylim=(0, None),
           title="the trade-off: smaller chunks, smoother decodes,\nlater first token for the long prompt")
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[2]
    names = ["unchunked"] + [f"chunk {c}" for c in sizes]
    bars = ax.bar(range(len(names)), [rows[n]["output_tok_per_s"] for n in names],
                  color=["#999"] + ["#2a7" if c == default else "#8c8" for c in sizes])
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(names)), [n.replace("chunk ", "") for n in names], fontsize=8)
    ax.set(xlabel="max_tokens_per_prefill_chunk", ylabel="tok/s",
           title="output tokens / s, all requests\n(higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
