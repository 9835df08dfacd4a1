"""Chapter 13 benchmark: decoders' inter-token latency while long prompts arrive — one engine without and
with chunked prefill, against a disaggregated prefill engine + decode engine — in one run.

    python benchmarks/disaggregation.py [--decoders 8] [--long-prompts 6] [--repeats 3]
    python benchmarks/disaggregation.py --plot-only      (redraw the plot from the saved JSON)
    python benchmarks/disaggregation.py --out /tmp/check  (write the results elsewhere: a trial run)

Workload (shipped target, greedy, ignore_eos), on the same wall-clock arrivals for every system:
--decoders requests with 24-token prompts decode --decode-tokens tokens each; meanwhile --long-prompts
prompts of --prompt-len tokens arrive one every --every seconds from 0.5 s, generating 8 tokens each.

Systems, all behind the same kind of front end (an engine core in its own process, chapter 10), all
with the paged cache and the prefix cache, and the same total torch threads:
  unchunked       one engine core (--threads threads), a long prompt in one step
  chunked         the same with chunked_prefill=True (the course default chunk)
  disaggregated   a prefill core and a decode core (--threads / 2 threads each): the prompts' K/V go
                  from the first to the second (minillm/disagg/)
Measured: the decoders' ITL p50 / p99 (the stall a prefill causes them), the long prompts' TTFT, and
for the pair the K/V transfers (bytes, time to receive and store). Each system runs --repeats times,
alternating; rows are the least disturbed run (shortest wall time); ratios are medians of the ratio
within each repeat. Outputs are asserted identical across systems.
Results: benchmarks/results/disaggregation.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
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
from minillm.config import EngineConfig  # noqa: E402
from minillm.disagg.router import DisaggregatedLLM  # noqa: E402
from minillm.engine_core import ProcessAsyncLLM  # noqa: E402
from minillm.metrics import percentile  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = ("unchunked", "chunked", "disaggregated")


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def workload(tokenizer, args) -> list[tuple[float, list[int], int, str]]:
    """(arrival offset in seconds, prompt, new tokens, kind) per request, sorted by arrival."""
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    long_text = text * (1 + args.prompt_len // len(text))
    requests = [(0.0, text[24 * i : 24 * (i + 1)], args.decode_tokens, "decoder") for i in range(args.decoders)]
    for k in range(args.long_prompts):  # each starts at a different place: no prefix-cache hits between them
        start = 97 * k
        requests.append((0.5 + k * args.every, long_text[start : start + args.prompt_len], 8, "long prompt"))
    return requests


def start(system: str, args):
    config = EngineConfig(kv="paged", block_size=16, max_num_seqs=16, max_model_len=2048, prefix_cache=True,
                          chunked_prefill=system == "chunked")
    if system == "disaggregated":
        return DisaggregatedLLM(config=config, threads=(max(1, args.threads // 2), max(1, args.threads // 2)))
    return ProcessAsyncLLM(config=config, threads=args.threads)


async def serve(llm, requests) -> tuple[list, float]:
    began = time.perf_counter()
    futures = []
    for offset, prompt, n, _ in requests:
        await asyncio.sleep(max(0.0, began + offset - time.perf_counter()))
        futures.append(llm.submit(prompt, greedy(n)))
    outputs = await asyncio.gather(*futures)
    return outputs, time.perf_counter() - began


def measure(system: str, args, requests) -> dict:
    llm = start(system, args)
    try:
        asyncio.run(serve(llm, requests[:1]))  # warm-up
        if isinstance(llm, DisaggregatedLLM):
            llm.transfers.clear()
            llm.lane_spans.clear()
        outputs, wall = asyncio.run(serve(llm, requests))
        itls = [x for o, r in zip(outputs, requests) if r[3] == "decoder" for x in o.metrics.itls]
        ttfts = [o.metrics.ttft for o, r in zip(outputs, requests) if r[3] == "long prompt"]
        row = {"itl_p50_s": percentile(itls, 50), "itl_p99_s": percentile(itls, 99), "itl_max_s": max(itls),
               "long_prompt_ttft_p50_s": percentile(ttfts, 50), "wall_s": wall,
               "output_tok_per_s": sum(len(o.token_ids) for o in outputs) / wall,
               "outputs": [o.token_ids for o in outputs]}
        if isinstance(llm, DisaggregatedLLM):
            long = [(h, at) for h, at in llm.transfers if h.num_blocks >= args.prompt_len // 16 - 1]  # not decoders'
            sizes = {f"{h.num_blocks} blocks," for h, _ in long}
            received = [end - begin for lane, kind, begin, end, label in llm.lane_spans
                        if kind == "receive KV" and label.split(" KiB")[0].rsplit(" ", 1)[0] in sizes]
            row |= {"kv_transfers": len(long), "kv_bytes_per_long_prompt": statistics.median(h.nbytes for h, _ in long),
                    "kv_blocks_per_long_prompt": statistics.median(h.num_blocks for h, _ in long),
                    "kv_receive_ms_p50": percentile(received, 50) * 1e3,
                    "kv_handle_to_decode_ms_p50": statistics.median((at - h.sent_at) * 1e3 for h, at in long)}
        return row
    finally:
        llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoders", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=300)
    parser.add_argument("--long-prompts", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--every", type=float, default=0.3,
                        help="seconds between two long prompts: each stalls every decoder once, and the decoders' "
                             "300 tokens make those stalls 2%% of their ITLs, which p99 sees")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (the pair: half each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((args.out / "disaggregation.json").read_text()), args.out / "disaggregation.png")
        return
    requests = workload(minillm.load_tokenizer(), args)
    runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    for _ in range(args.repeats):
        for name in SYSTEMS:
            m = measure(name, args, requests)
            runs[name].append(m)
            print(f"{name:14s} ITL p50 {m['itl_p50_s'] * 1e3:5.1f} ms  p99 {m['itl_p99_s'] * 1e3:6.1f} ms  long-prompt "
                  f"TTFT {m['long_prompt_ttft_p50_s'] * 1e3:6.0f} ms  {m['output_tok_per_s']:5.0f} tok/s")
    reference = runs["unchunked"][0]["outputs"]
    assert all(r["outputs"] == reference for rs in runs.values() for r in rs), "outputs differ between systems"
    rows = {name: {k: v for k, v in min(rs, key=lambda r: r["wall_s"]).items() if k != "outputs"}
            for name, rs in runs.items()}

    def ratio(system: str, key: str, base: str) -> float:
        return statistics.median(s[key] / b[key] for s, b in zip(runs[system], runs[base]))

    ratios = {"itl_p99_unchunked_vs_disaggregated": 1 / ratio("disaggregated", "itl_p99_s", "unchunked"),
              "itl_p99_chunked_vs_disaggregated": 1 / ratio("disaggregated", "itl_p99_s", "chunked"),
              "itl_p99_unchunked_vs_chunked": 1 / ratio("chunked", "itl_p99_s", "unchunked"),
              "itl_p50_disaggregated_vs_unchunked": ratio("disaggregated", "itl_p50_s", "unchunked"),
              "long_prompt_ttft_disaggregated_vs_unchunked": ratio("disaggregated", "long_prompt_ttft_p50_s",
                                                                   "unchunked"),
              "long_prompt_ttft_chunked_vs_unchunked": ratio("chunked", "long_prompt_ttft_p50_s", "unchunked"),
              "tok_per_s_disaggregated_vs_unchunked": ratio("disaggregated", "output_tok_per_s", "unchunked"),
              "repeats": args.repeats}
    print(f"ITL p99: unchunked / disaggregated {ratios['itl_p99_unchunked_vs_disaggregated']:.1f}x, chunked / "
          f"disaggregated {ratios['itl_p99_chunked_vs_disaggregated']:.1f}x; long-prompt TTFT disaggregated / "
          f"unchunked {ratios['long_prompt_ttft_disaggregated_vs_unchunked']:.2f}x; K/V receive p50 "
          f"{rows['disaggregated']['kv_receive_ms_p50']:.1f} ms for "
          f"{rows['disaggregated']['kv_bytes_per_long_prompt'] / 2**20:.1f} MiB")
    meta = {"machine": f"{platform.machine()}, {args.threads} torch threads in all, torch {torch.__version__}",
            "decoders": args.decoders, "decode_tokens": args.decode_tokens, "long_prompts": args.long_prompts,
            "prompt_len": args.prompt_len, "every_s": args.every, "repeats": args.repeats,
            "chunk": EngineConfig().max_tokens_per_prefill_chunk, "outputs_identical": True}
    saved = {"meta": meta, "rows": rows, "ratios": ratios,
             "runs": {n: [{k: v for k, v in r.items() if k != "outputs"} for r in rs] for n, rs in runs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "disaggregation.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, args.out / "disaggregation.png")
    print(f"wrote {args.out / 'disaggregation.json'} and disaggregation.png")


def plot(saved: dict, path: Path) -> None:
    """Left: the decoders' ITL p50 and p99 per system. Right: the long prompts' TTFT per system."""
    rows = saved["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    x = range(len(SYSTEMS))
    left.bar([i - 0.2 for i in x], [rows[s]["itl_p50_s"] * 1e3 for s in SYSTEMS], width=0.4, label="p50",
             color="#4c78a8")
    left.bar([i + 0.2 for i in x], [rows[s]["itl_p99_s"] * 1e3 for s in SYSTEMS], width=0.4, label="p99",
             color="#e45756")
    left.set_xticks(list(x), SYSTEMS)
    left.set_ylabel("decoders' inter-token latency (ms)")
    left.set_title(f"while {saved['meta']['long_prompts']} prompts of {saved['meta']['prompt_len']} tokens arrive")
    left.legend()
    right.bar(list(x), [rows[s]["long_prompt_ttft_p50_s"] * 1e3 for s in SYSTEMS], color="#54a24b")
    right.set_xticks(list(x), SYSTEMS)
    right.set_ylabel("long prompts' TTFT p50 (ms)")
    right.set_title("what the long prompts pay (the pair: plus the K/V transfer)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
