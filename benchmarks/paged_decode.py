"""Chapter 4 GPU benchmark: paged decode attention, Triton kernel vs the torch reference, and the
engine's output tok/s with each (CUDA only; scripts/gpu_check.sh runs it).

    python benchmarks/paged_decode.py [--heads 32 --kv-heads 8 --head-dim 128 --block-size 16]

Kernel: a Llama-8B-like attention shape (32 query heads, 8 KV heads of 128, bfloat16) over batches
of 1–128 sequences and contexts of 512–4096 tokens in shuffled blocks; the outputs are compared
(max |diff|) and timed with CUDA events. Engine: the shipped target on the mixed workload of
benchmarks/batching.py, contiguous vs paged (torch reference) vs paged (Triton), outputs asserted
identical. Results: benchmarks/results/paged_decode.json and paged_decode.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from batching import make_workload  # noqa: E402  (benchmarks/batching.py, beside this script)

import minillm  # noqa: E402
from minillm.attention import paged_ops  # noqa: E402
from minillm.config import EngineConfig  # noqa: E402
from minillm.engine import LLM  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def time_cuda(fn, repeats: int = 20) -> float:
    """Median milliseconds of fn() on the GPU."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def kernel_rows(args) -> list[dict]:
    from minillm.attention import triton_paged

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch in (1, 8, 32, 128):
        for context in (512, 4096):
            blocks_per_seq = -(-context // args.block_size)
            num_blocks = batch * blocks_per_seq + 1
            shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
            k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
            v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
            tables = torch.randperm(num_blocks, device="cuda", generator=gen)[: batch * blocks_per_seq]
            tables = tables.view(batch, blocks_per_seq).int()
            lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
            q = torch.randn(batch, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            scale = args.head_dim**-0.5
            ref = paged_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
            out = triton_paged.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
            kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * 2
            inputs = (q, k_cache, v_cache, tables, lens, scale)
            t_ref = time_cuda(lambda inputs=inputs: paged_ops.paged_decode_attention(*inputs))
            t_tri = time_cuda(lambda inputs=inputs: triton_paged.paged_decode_attention(*inputs))
            rows.append({"batch": batch, "context": context, "torch_ms": t_ref, "triton_ms": t_tri,
                         "speedup": t_ref / t_tri, "triton_kv_GBps": kv_bytes / t_tri / 1e6,
                         "max_abs_diff": (out.float() - ref.float()).abs().max().item()})
            r = rows[-1]
            print(f"  batch {batch:3d} context {context:5d}: torch {t_ref:7.3f} ms, triton {t_tri:7.3f} ms "
                  f"({r['speedup']:.1f}x, {r['triton_kv_GBps']:.0f} GB/s), diff {r['max_abs_diff']:.1e}")
    return rows


def engine_rows(requests: int) -> list[dict]:
    tokenizer = minillm.load_tokenizer()
    workload = make_workload("mixed", requests, tokenizer)
    params = [minillm.SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for _, n in workload]
    rows, outputs = [], {}
    paged = {"kv": "paged", "kv_cache_bytes": 2**30}  # a fixed budget: the default takes 90 % of the free GPU memory
    for name, extra in (("contiguous", {}), ("paged, torch reference", {**paged, "use_triton": False}),
                        ("paged, Triton", {**paged, "use_triton": True})):
        llm = LLM(config=EngineConfig(max_num_seqs=64, max_model_len=512, device="cuda", dtype="float32", **extra))
        llm.generate([p for p, _ in workload[:4]], params[:4], use_tqdm=False)  # warm-up (Triton compiles)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate([p for p, _ in workload], params, use_tqdm=False)
        wall = time.perf_counter() - start
        outputs[name] = [o.token_ids for o in outs]
        rows.append({"system": name, "output_tok_per_s": sum(n for _, n in workload) / wall, "wall_s": wall})
        print(f"  engine {name:24s} {rows[-1]['output_tok_per_s']:8.0f} tok/s")
        del llm
        torch.cuda.empty_cache()
    assert outputs["contiguous"] == outputs["paged, torch reference"] == outputs["paged, Triton"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/paged_decode.py needs a CUDA GPU; nothing measured on this machine.")
        sys.exit(0)
    print(f"GPU: {torch.cuda.get_device_name()}")
    kernel, engine = kernel_rows(args), engine_rows(args.requests)
    RESULTS.mkdir(exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, **vars(args)}
    (RESULTS / "paged_decode.json").write_text(json.dumps({"meta": meta, "kernel": kernel, "engine": engine},
                                                          indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4))
    for context in sorted({r["context"] for r in kernel}):
        sub = [r for r in kernel if r["context"] == context]
        ax.plot([r["batch"] for r in sub], [r["speedup"] for r in sub], marker="o", label=f"context {context}")
    ax.set(xscale="log", xlabel="sequences in the batch", ylabel="Triton speed-up over torch reference",
           title="paged decode attention")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "paged_decode.png", dpi=120)
    print(f"wrote {RESULTS / 'paged_decode.json'} and paged_decode.png")


if __name__ == "__main__":
    main()
