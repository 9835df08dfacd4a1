"""Chapter 7 benchmark: speculative decoding, minillm and Hugging Face transformers, in one run.

    python benchmarks/speculative.py [--prompts 6] [--new-tokens 96] [--ks 2 3 4 5 6]
    python benchmarks/speculative.py --plot-only      (redraw the plot from the saved JSON)

Two tasks on held-out Shakespeare (minillm/assets/heldout_sample.txt), greedy, batch 1:
  continuation  a 48-token passage, then --new-tokens free tokens; proposer: the shipped draft model
  copy          a passage of 64 tokens, a newline, and its first 8 tokens again: the continuation
                copies from the prompt; proposer: n-gram prompt lookup
Per task and k: minillm without speculation and with it (EngineConfig(speculative=...), contiguous
KV, max_num_seqs=1), and in the same run, on the same prompts, transformers' generate without and
with its own speculation: assisted generation with the same draft (`assistant_model`, continuation)
and prompt lookup (`prompt_lookup_num_tokens`, copy). Then the continuation at batch 4 and 16
(minillm only: assisted generation runs one sequence at a time), where speculation stops paying.
Each configuration runs --repeats times, alternating: a row is its fastest (least disturbed) run,
a speedup the median over the repeats of the ratio within one repeat. Every run's tokens are
asserted equal to the run without speculation (greedy: speculation changes no token).
Results: benchmarks/results/speculative.json and .png.
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

import minillm  # noqa: E402
from minillm.config import EngineConfig, SpeculativeConfig  # noqa: E402
from minillm.engine import LLMEngine  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METHOD = {"continuation": "draft", "copy": "ngram"}


def prompts_for(tokenizer, task: str, count: int) -> list[list[int]]:
    text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    starts = [(97 * i) % (len(text) - 80) for i in range(count)]
    if task == "continuation":
        return [text[s : s + 48] for s in starts]
    newline = tokenizer.encode("\n")
    return [text[s : s + 64] + newline + text[s : s + 8] for s in starts]


def run_minillm(model, tokenizer, prompts: list[list[int]], new_tokens: int, batch: int,
                spec: SpeculativeConfig | None) -> tuple[list[list[int]], float, dict | None]:
    """All prompts, `batch` at a time; returns tokens, output tok/s, and the speculation metrics."""
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=batch, max_model_len=512, speculative=spec))
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    ids = [engine.add_request(p, params).request_id for p in prompts]
    while engine.has_unfinished():
        engine.step()
    wall = time.perf_counter() - start
    outputs = [engine.output(i).token_ids for i in ids]
    return outputs, sum(map(len, outputs)) / wall, engine.speculative_metrics


@torch.inference_mode()
def run_hf(hf, prompts: list[list[int]], new_tokens: int, **speculation) -> tuple[list[list[int]], float]:
    """transformers' generate, one prompt at a time (assisted generation supports batch 1 only)."""
    outputs, start = [], time.perf_counter()
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **speculation)
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs, sum(map(len, outputs)) / (time.perf_counter() - start)


def measure_task(task: str, method: str, model, tokenizer, hf, hf_draft, args) -> dict:
    """minillm without and with speculation (every k), transformers without and with its own, alternating."""
    prompts = prompts_for(tokenizer, task, args.prompts)
    hf_spec = {"assistant_model": hf_draft} if method == "draft" else {"prompt_lookup_num_tokens": 4}
    systems = {"minillm": lambda: run_minillm(model, tokenizer, prompts, args.new_tokens, 1, None)}
    for k in args.ks:
        systems[f"minillm k={k}"] = lambda k=k: run_minillm(model, tokenizer, prompts, args.new_tokens, 1,
                                                            SpeculativeConfig(method, k))
    systems["transformers"] = lambda: (*run_hf(hf, prompts, args.new_tokens), None)
    systems["transformers speculative"] = lambda: (*run_hf(hf, prompts, args.new_tokens, **hf_spec), None)
    runs: dict[str, list] = {name: [] for name in systems}
    for _ in range(args.repeats):
        for name, fn in systems.items():
            tokens, tok_s, metrics = fn()
            runs[name].append((tok_s, tokens, metrics))
    reference = runs["minillm"][0][1]
    for name, measured in runs.items():
        if name.startswith("minillm"):
            assert all(tokens == reference for _, tokens, _ in measured), f"{task}: {name} changed tokens"
    best = {name: max(measured, key=lambda m: m[0]) for name, measured in runs.items()}  # the least disturbed run
    rows = {name: {"output_tok_per_s": tok_s, **({"speculation": metrics} if metrics else {})}
            for name, (tok_s, _, metrics) in best.items()}
    for name, row in rows.items():
        extra = row.get("speculation")
        print(f"{task:12s} {name:26s} {row['output_tok_per_s']:6.0f} tok/s"
              + (f"  accepted {extra['acceptance_rate']:.0%}, {extra['tokens_per_pass']:.2f} tokens/pass"
                 if extra else ""))

    def paired(name: str, base: str) -> float:
        """The median over the repeats of the speedup within one repeat (the two ran one after the other)."""
        return float(median(a[0] / b[0] for a, b in zip(runs[name], runs[base])))

    speedups = {f"minillm_k{k}": paired(f"minillm k={k}", "minillm") for k in args.ks}
    speedups["transformers"] = paired("transformers speculative", "transformers")
    return {"method": method, "rows": rows,
            "transformers_speculation": "assistant_model=draft" if method == "draft" else "prompt_lookup_num_tokens=4",
            "transformers_outputs_equal_minillm": sum(a == b for a, b in zip(best["transformers"][1], reference)),
            "speedups": speedups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS / "speculative.json").read_text()), RESULTS / "speculative.png")
        return
    torch.manual_seed(0)
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    hf = AutoModelForCausalLM.from_pretrained(minillm.ASSETS_DIR / "target", dtype=torch.float32).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(minillm.ASSETS_DIR / "draft", dtype=torch.float32).eval()
    tasks = {task: measure_task(task, method, model, tokenizer, hf, hf_draft, args) for task, method in METHOD.items()}
    batches = {}
    prompts = prompts_for(tokenizer, "continuation", 16)
    for batch in args.batches:
        pairs = [tuple(run_minillm(model, tokenizer, prompts, args.new_tokens, batch, config)[1]
                       for config in (None, SpeculativeConfig("draft", 4))) for _ in range(args.repeats)]
        plain, spec = max(p for p, _ in pairs), max(s for _, s in pairs)
        batches[batch] = {"no speculation": plain, "draft k=4": spec,
                          "speedup": float(median(s / p for p, s in pairs))}
        print(f"continuation batch {batch:2d}: {plain:6.0f} -> {spec:6.0f} tok/s ({spec / plain:.2f}x)")
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "prompts": args.prompts, "new_tokens": args.new_tokens, "ks": args.ks, "repeats": args.repeats}
    saved = {"meta": meta, "tasks": tasks, "batches": {str(b): v for b, v in batches.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speculative.json").write_text(json.dumps(saved, indent=2) + "\n")
    plot(saved, RESULTS / "speculative.png")
    print(f"wrote {RESULTS / 'speculative.json'} and speculative.png")


def plot(saved: dict, path: Path) -> None:
    """Left, per task: minillm's speedup and tokens per target pass against k, transformers' speedup as a
    line. Right: the speedup at batch 1, 4 and 16."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ks = saved["meta"]["ks"]
    for ax, (task, result) in zip(axes[:2], saved["tasks"].items()):
        rows = result["rows"]
        speedups = [result["speedups"][f"minillm_k{k}"] for k in ks]
        per_pass = [rows[f"minillm k={k}"]["speculation"]["tokens_per_pass"] for k in ks]
        ax.plot(ks, speedups, "o-", color="#2a7", label="minillm: speedup over no speculation")
        ax.plot(ks, per_pass, "s--", color="#555", label="minillm: tokens per target pass")
        ax.axhline(result["speedups"]["transformers"], color="#c60", ls=":",
                   label=f"transformers: speedup ({'assisted' if result['method'] == 'draft' else 'prompt lookup'})")
        ax.axhline(1, color="#bbb", lw=1)
        ax.set_xticks(ks)
        # both curves are against plain decoding, which makes 1 token per pass at 1x: one axis, named for both
        ax.set(xlabel="k (guesses per step)", ylim=(0, None),
               ylabel="against plain decoding (= 1):\nspeedup (x), tokens per pass",
               title=f"{task}, batch 1 ({'draft model' if result['method'] == 'draft' else 'n-gram lookup'})")
        ax.legend(fontsize=7)
    ax = axes[2]
    batches = {"1": saved["tasks"]["continuation"]["speedups"]["minillm_k4"],
               **{b: v["speedup"] for b, v in saved["batches"].items()}}
    bars = ax.bar(list(batches), list(batches.values()), color="#2a7")
    ax.bar_label(bars, fmt="%.2fx", fontsize=8, padding=2)
    ax.axhline(1, color="#999", lw=1)
    ax.set(xlabel="batch size (requests decoding at once)", ylabel="speedup over no speculation, draft k=4",
           title="where speculation stops paying",
           ylim=(0, max(batches.values()) * 1.15))  # room above the tallest bar for its label
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
