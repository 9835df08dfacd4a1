"""Chapter 8 benchmark: what a decode step costs beyond its arithmetic, and what recording it saves.

    python benchmarks/decode_overhead.py [--batches 1 2 4 8 16 32 64] [--repeats 3] [--dtypes float32 bfloat16]
    python benchmarks/decode_overhead.py --plot-only      (redraw the plot from the saved JSON)

On the shipped target, in one run:
  1. decode-step time against batch size, eager vs compiled (EngineConfig(compile=True)) — and on
     CUDA eager vs CUDA Graphs vs compiled — per dtype: each batch size runs that many requests
     (64-token prompts, greedy) and a step's time is the engine's own (schedule, forward, sample,
     book-keeping) for the steps where every request decodes; the row is the median of those steps
     in the fastest repeat, the speedup the median of the per-repeat ratios (repeats alternate);
  2. the operators one batch-1 step dispatches (torch.profiler; on CUDA the kernels it launches),
     eager vs recorded;
  3. batch-1 TPOT on six 48-token prompts x 128 new tokens: minillm eager and recorded against
     transformers' `generate` with its dynamic cache and with its static cache compiled (the fast
     path its docs recommend), per dtype.
Greedy tokens of every recorded run are asserted equal to eager in float32 (in bfloat16 a fused
kernel may round differently and flip a near tie, so there they are counted, not asserted).
Results: benchmarks/results/decode_overhead.json and .png (on a GPU: decode_overhead_cuda.json and .png).
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
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.generation.configuration_utils import CompileConfig  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402

import minillm  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLMEngine  # noqa: E402
from minillm.graphs.step_profile import profile_step  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def modes() -> list[str]:
    return ["eager", "compile"] + (["cuda_graphs"] if torch.cuda.is_available() else [])


def make_engine(model, tokenizer, mode: str, batch: int) -> LLMEngine:
    config = EngineConfig(kv="paged", max_num_seqs=batch, max_model_len=512, compile=mode == "compile",
                          cuda_graphs=mode == "cuda_graphs", graph_batch_sizes=(batch,) if mode != "eager" else None,
                          kv_cache_bytes=1 << 30 if model.device.type == "cuda" else None)  # engines side by side
    return LLMEngine(model, tokenizer, config)


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    return [text[(97 * i) % (len(text) - length) :][:length] for i in range(count)]


def decode_steps(engine: LLMEngine, batch_prompts: list[list[int]], new_tokens: int) -> tuple[list[float], list]:
    """Serve the prompts together; the durations of the steps where all of them decode, and the tokens."""
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    first = engine.trace.next_step
    ids = [engine.add_request(p, params).request_id for p in batch_prompts]
    while engine.has_unfinished():
        engine.step()
    steps = [s for s in engine.trace.steps if s.step >= first and s.decode_tokens == len(batch_prompts)
             and not s.prefill_tokens]
    tokens = [engine.output(i).token_ids for i in ids]
    for i in ids:
        engine.release(i)
    return [s.duration for s in steps], tokens


def step_times(model, tokenizer, batches: list[int], repeats: int, new_tokens: int) -> list[dict]:
    rows = []
    for batch in batches:
        batch_prompts = prompts(tokenizer, batch, 64)
        engines = {m: make_engine(model, tokenizer, m, batch) for m in modes()}
        for engine in engines.values():  # warm-up: compile / capture, allocator, caches
            decode_steps(engine, batch_prompts, 4)
        runs: dict[str, list[float]] = {m: [] for m in engines}
        tokens = {}
        for _ in range(repeats):
            for mode, engine in engines.items():
                durations, tokens[mode] = decode_steps(engine, batch_prompts, new_tokens)
                runs[mode].append(median(durations))
        same = {m: sum(a == b for a, b in zip(tokens[m], tokens["eager"])) for m in engines}
        if model.dtype == torch.float32:
            assert all(n == batch for n in same.values()), f"recorded steps changed greedy tokens: {same}"
        row = {"batch": batch, "dtype": str(model.dtype).removeprefix("torch."), "equal_outputs": same}
        for mode in engines:
            row[f"{mode}_ms"] = min(runs[mode]) * 1e3
            if mode != "eager":
                row[f"{mode}_speedup"] = median(e / r for e, r in zip(runs["eager"], runs[mode]))
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        rows.append(row)
        del engines
        torch._dynamo.reset()  # a fresh compile cache per batch size: each engine compiles only its own bucket
    return rows


def operator_counts(model, tokenizer) -> dict:
    counts = {}
    for mode in modes():
        engine = make_engine(model, tokenizer, mode, 1)
        engine.add_request(prompts(tokenizer, 1, 64)[0], SamplingParams(temperature=0, max_new_tokens=40,
                                                                        ignore_eos=True))
        for _ in range(8):
            engine.step()
        profile = profile_step(engine.step, mode)
        counts[mode] = {"host_ops": profile.num_host_ops, "kernels": profile.num_kernels,
                        "profiled_step_us": profile.wall_us}
        while engine.has_unfinished():
            engine.step()
    print("operators per batch-1 step:", counts)
    return counts


class _Clock(BaseStreamer):
    """Notes the time each new token reaches the streamer (the first `put` is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_tpot(hf, prompt_ids: list[list[int]], new_tokens: int, compiled: bool) -> tuple[float, list[list[int]]]:
    kwargs = {}
    if compiled:
        config = CompileConfig(fullgraph=True, mode="default")
        config._compile_all_devices = True  # transformers compiles on GPUs only unless asked
        kwargs = {"cache_implementation": "static", "compile_config": config}
    tpots, outs = [], []
    for ids in prompt_ids:
        clock = _Clock()
        out = hf.generate(torch.tensor([ids], device=hf.device), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, streamer=clock, **kwargs)
        times = clock.times[1:]
        tpots.append((times[-1] - times[0]) / (len(times) - 1))
        outs.append(out[0, len(ids) :].tolist())
    return median(tpots), outs


def tpot_rows(model, tokenizer, dtype: str, new_tokens: int) -> dict:
    device = model.device
    hf = AutoModelForCausalLM.from_pretrained(str(minillm.ASSETS_DIR / "target"), dtype=model.dtype).to(device).eval()
    batch_prompts = prompts(tokenizer, 6, 48)
    row = {"dtype": dtype}
    for compiled in (False, True):
        name = "transformers static cache, compiled" if compiled else "transformers"
        hf_tpot(hf, batch_prompts[:1], 8, compiled)  # warm-up (compiles)
        row[name], _ = hf_tpot(hf, batch_prompts, new_tokens, compiled)
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    for mode in modes():
        engine = make_engine(model, tokenizer, mode, 1)
        decode_steps(engine, batch_prompts[:1], 8)
        tpots = []
        for p in batch_prompts:
            request_id = engine.add_request(p, params).request_id
            while engine.has_unfinished():
                engine.step()
            tpots.append(engine.output(request_id).metrics.tpot)
        row[{"eager": "minillm eager", "compile": "minillm compiled", "cuda_graphs": "minillm CUDA Graphs"}[mode]] = \
            median(tpots)
    print("batch-1 TPOT (ms):", {k: round(v * 1e3, 3) if isinstance(v, float) else v for k, v in row.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.plot_only:
        plot(json.loads((RESULTS / "decode_overhead.json").read_text()), RESULTS / "decode_overhead.png")
        return
    tokenizer = minillm.load_tokenizer()
    saved = {"machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                         "torch": torch.__version__, "threads": torch.get_num_threads(),
                         "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
             "steps": [], "operators": {}, "tpot": []}
    for dtype in args.dtypes:
        model = minillm.load_model(dtype=dtype)
        saved["steps"] += step_times(model, tokenizer, args.batches, args.repeats, args.new_tokens)
        saved["operators"][dtype] = operator_counts(model, tokenizer)
        saved["tpot"].append(tpot_rows(model, tokenizer, dtype, 128))
        torch._dynamo.reset()
    name = "decode_overhead_cuda" if torch.cuda.is_available() else "decode_overhead"  # chapter 8 reads the CPU's
    (RESULTS / f"{name}.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, RESULTS / f"{name}.png")
    print(f"wrote {RESULTS / name}.json and .png")


def plot(saved: dict, path: Path) -> None:
    dtypes = sorted({r["dtype"] for r in saved["steps"]}, reverse=True)
    fig, axes = plt.subplots(1, len(dtypes) + 1, figsize=(5.2 * (len(dtypes) + 1), 4.2))
    styles = {"eager": ("tab:gray", "eager"), "compile": ("tab:blue", "compiled"),
              "cuda_graphs": ("tab:green", "CUDA Graphs")}
    top = max(r["eager_ms"] for r in saved["steps"]) * 1.15
    for ax, dtype in zip(axes, dtypes):
        rows = [r for r in saved["steps"] if r["dtype"] == dtype]
        positions = range(len(rows))  # batch sizes evenly spaced, labelled
        for mode, (colour, label) in styles.items():
            if f"{mode}_ms" in rows[0]:
                ax.plot(positions, [r[f"{mode}_ms"] for r in rows], "o-", color=colour, label=label)
        for x, r in zip(positions, rows):
            if "compile_speedup" in r:
                ax.annotate(f"{r['compile_speedup']:.2f}x", (x, r["compile_ms"]), textcoords="offset points",
                            xytext=(0, -14), ha="center", fontsize=8, color="tab:blue")
        ax.set(xlabel="requests decoding (batch size)", ylabel="ms per decode step", ylim=(0, top),
               title=f"engine decode step, {dtype} (speedup in blue)")
        ax.set_xticks(list(positions), [str(r["batch"]) for r in rows])
        ax.legend(loc="upper left")
    ax = axes[-1]
    names = [k for k in saved["tpot"][0] if k != "dtype"]
    width = 0.8 / len(saved["tpot"])
    dtype_colours = ["#9d755d", "#b279a2"]  # not the blue / grey of the modes in the other panels
    for i, row in enumerate(saved["tpot"]):
        ax.barh([j + i * width for j in range(len(names))], [row[n] * 1e3 for n in names], height=width,
                label=row["dtype"], color=dtype_colours[i % 2])
    ax.set_yticks([j + width * (len(saved["tpot"]) - 1) / 2 for j in range(len(names))],
                  [n.replace("transformers ", "transformers\n") for n in names], fontsize=8)
    ax.set(xlabel="ms per output token", title="batch-1 TPOT, median of 6 prompts")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(saved["tpot"]))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
