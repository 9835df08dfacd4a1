"""Chapter 1 benchmark: one request at a time — naive loop, KV-cached loop, Hugging Face generate.

    python benchmarks/generate_loops.py [--new-tokens 32 64 128 256] [--repeats 3]

Runs the shipped target greedily on one prompt for several output lengths, checks that all three
produce the same tokens, and writes benchmarks/results/generate_loops.{json,png}. Report ratios:
absolute times depend on the machine.
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
from transformers import AutoModelForCausalLM  # noqa: E402

import minillm  # noqa: E402
from minillm.generate import generate_with_cache, generate_without_cache  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def best_of(repeats: int, fn, *args, **kwargs):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best, out


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", default="ROMEO:")
    args = parser.parse_args()

    model, tokenizer = minillm.load(device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(minillm.ASSETS_DIR / "target", dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # run every length to the end, like ignore_eos
    prompt_ids = tokenizer.encode(args.prompt)
    rows = []
    for m in args.new_tokens:
        params = minillm.SamplingParams(temperature=0, max_new_tokens=m, ignore_eos=True)
        t_naive, naive = best_of(args.repeats, generate_without_cache, model, tokenizer, prompt_ids, params)
        t_cached, cached = best_of(args.repeats, generate_with_cache, model, tokenizer, prompt_ids, params)
        t_hf, hf_out = best_of(args.repeats, hf.generate, torch.tensor([prompt_ids]), max_new_tokens=m,
                               min_new_tokens=0, do_sample=False, pad_token_id=0)
        hf_ids = hf_out[0, len(prompt_ids):].tolist()
        assert naive.token_ids == cached.token_ids == hf_ids, f"outputs differ at {m} new tokens"
        rows.append({"new_tokens": m, "naive_s": t_naive, "cached_s": t_cached, "hf_generate_s": t_hf,
                     "cached_vs_naive": t_naive / t_cached, "cached_vs_hf": t_hf / t_cached})
        print(f"{m:4d} tokens  naive {t_naive:6.3f}s  cached {t_cached:6.3f}s  HF {t_hf:6.3f}s  "
              f"cached is {t_naive / t_cached:4.1f}x naive, {t_hf / t_cached:4.2f}x HF generate")

    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "model": "minillm/assets/target", "prompt": args.prompt, "repeats": args.repeats}
    (RESULTS / "generate_loops.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    xs = [r["new_tokens"] for r in rows]
    plt.figure(figsize=(6, 4))
    for key, label in (("naive_s", "minillm naive (no cache)"), ("cached_s", "minillm KV cache"),
                       ("hf_generate_s", "HF generate")):
        plt.plot(xs, [r[key] for r in rows], "o-", label=label)
    plt.xlabel("new tokens (greedy, one request)")
    plt.ylabel("seconds (best of repeats)")
    plt.title("Generation loops on the shipped target")
    plt.legend()
    plt.tight_layout()
    plt.savefig(RESULTS / "generate_loops.png", dpi=120)
    print(f"wrote {RESULTS / 'generate_loops.json'} and .png")


if __name__ == "__main__":
    main()
