"""Chapter 12 benchmark: what quantizing the weights and the KV cache costs in quality and buys in bytes and time.

    python benchmarks/quantization.py [--rounds 5] [--tokens 48] [--quick] [--plot-only]

Run it with a Python that also has torchao (its own venv: the project never needs it) to put torchao's int8
weight-only layers beside ours; without torchao the results say why it is missing and go on.

Weight schemes, on the shipped target (the embeddings and the tied LM head stay float in every one):

    fp32, bf16           the float model in float32 / bfloat16 (the engine's CPU default is float32)
    int8                 minillm's int8 per output channel (`quantize_model`) in the float32 model
    int4 g32 / g64 / g128  minillm's asymmetric int4 in groups of 32, 64 or 128 inputs, likewise
                         (both run PyTorch's CPU kernels with the activations rounded to bfloat16 for the matmul:
                         their float32 path is scalar — minillm/quantization/linear.py)
    bf16 + int8, bf16 + int4 g64   the same codes in the bfloat16 model (attention, norms, logits in bfloat16 too)
    torchao int8         torchao's Int8WeightOnlyConfig on the same four matmuls per layer of the float32 model
                         (eager; its 0.18 tensor turns the codes into a float matrix on every call, then torch.mm:
                         the dequantization is fused only under torch.compile)

Quality (minillm/quantization/quality.py): perplexity on the held-out text (windows of 512 tokens) as a ratio
to fp32's; arithmetic accuracy on all 200 single-digit questions in the trained prompt form; greedy agreement
with fp32 — `--prompts` prompts of 32 tokens cut from the held-out text, `--agreement-tokens` new tokens each,
the first divergence per prompt; and the relative error of the real weights under int8 per tensor, per
channel and int4 per group (formats.py). Size: bytes of the decoder layers' matmul weights (codes and scales) and of
the whole model. Speed: the engine's decode step (the median of the steps in which every request decoded,
from its trace) at batch 1 and 16, `--tokens` tokens per request, every scheme's engine run once per round
after a short unrecorded warm-up, rounds interleaved (minillm.timing.interleaved); quoted as the median over
rounds of each round's ratio to fp32 (and to bf16). The float32 engines' attention is the C decode kernel,
the bfloat16 ones' the torch reference (the kernel is float32 only): the JSON names each.

KV cache (paged, torch reference attention for every one, so only the stored numbers differ): auto with the
float32 model, auto with the bfloat16 model (a bfloat16 cache), int8 and fp8 with the float32 model. One byte
budget — what `--kv-fp32-requests` requests of `--kv-prompt` + `--kv-output` tokens hold in float32 — and
`--kv-requests` such long-context requests (prompts cut from the held-out text read twice over, greedy,
ignore_eos) through each: the tokens that fit, the peak concurrency from the trace (as
benchmarks/paged_capacity.py), and each request's first divergence from the float32 cache's outputs; beside
it the same greedy-agreement prompts as above, decoded with each cache.

Results: benchmarks/results/quantization.json and .png.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from statistics import mean, median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from tqdm import tqdm  # noqa: E402

import minillm  # noqa: E402
from minillm import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from minillm.attention.dense import DenseAttention  # noqa: E402
from minillm.attention.paged import kv_bytes_per_token  # noqa: E402
from minillm.model.decoder import CausalLM  # noqa: E402
from minillm.quantization import quantize_int4, quantize_int8, quantize_model, weight_bytes  # noqa: E402
from minillm.quantization.formats import quantize_per_tensor_int8  # noqa: E402
from minillm.quantization.model import QUANTIZED_LAYERS  # noqa: E402
from minillm.quantization.quality import (  # noqa: E402
    agreement,
    arithmetic_accuracy,
    arithmetic_questions,
    first_divergence,
    greedy_outputs,
    perplexity,
)
from minillm.timing import interleaved  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BATCHES = (1, 16)
PROMPT_TOKENS = 32  # the agreement and decode-timing prompts
# name -> (model dtype, quantization scheme or None, int4 group size)
SCHEMES = {
    "fp32": ("float32", None, None),
    "bf16": ("bfloat16", None, None),
    "int8": ("float32", "int8", None),
    "int4 g32": ("float32", "int4", 32),
    "int4 g64": ("float32", "int4", 64),
    "int4 g128": ("float32", "int4", 128),
    "bf16 + int8": ("bfloat16", "int8", None),
    "bf16 + int4 g64": ("bfloat16", "int4", 64),
}
TORCHAO = "torchao int8"
KV_CACHES = {"auto (fp32)": ("float32", "auto"), "auto (bf16 model)": ("bfloat16", "auto"),
             "int8": ("float32", "int8"), "fp8": ("float32", "fp8")}


# ----------------------------------------------------------------------------------------------- models
def torchao_int8(model: CausalLM) -> tuple[CausalLM | None, dict]:
    """A copy of `model` whose decoder matmuls hold torchao's int8 weight-only tensors, and what happened
    (torchao's version, or why there is no such copy). The copy's layers become plain nn.Linear first: minillm's
    Linear packs its weight for oneDNN, which a tensor subclass does not survive; nn.Linear calls F.linear,
    which torchao's tensor intercepts."""
    try:
        import torchao
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as err:  # ImportError, or a build that does not load
        return None, {"available": False, "reason": f"import torchao failed: {type(err).__name__}: {err}"}
    try:
        peer = copy.deepcopy(model)
        for name, module in peer.named_modules():
            if name.rsplit(".", 1)[-1] in QUANTIZED_LAYERS and isinstance(module, nn.Linear):
                module.__class__ = nn.Linear
        quantize_(peer, Int8WeightOnlyConfig(set_inductor_config=False),
                  filter_fn=lambda module, name: name.rsplit(".", 1)[-1] in QUANTIZED_LAYERS)
        with torch.inference_mode():  # one forward, so that a failure shows here and not mid-benchmark
            peer(torch.tensor([1, 2, 3]), torch.arange(3), DenseAttention([3]))
    except Exception as err:
        return None, {"available": False, "version": torchao.__version__,
                      "reason": f"quantize_ failed: {type(err).__name__}: {err}"}
    return peer, {"available": True, "version": torchao.__version__,
                  "config": "Int8WeightOnlyConfig() (per row, symmetric), eager"}


def torchao_weight_bytes(model: CausalLM) -> dict[str, int]:
    """weight_bytes for torchao's tensors, which report float32 as their dtype: their int8 codes and scales."""
    layers = other = 0
    quantized = set()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in QUANTIZED_LAYERS and isinstance(module, nn.Linear):
            w = module.weight
            parts = [getattr(w, a) for a in ("qdata", "scale", "zero_point") if isinstance(getattr(w, a, None),
                                                                                          torch.Tensor)]
            layers += sum(p.numel() * p.element_size() for p in parts)
            quantized.add(id(w))
    for p in {id(p): p for p in model.parameters()}.values():
        if id(p) not in quantized:
            other += p.numel() * p.element_size()
    return {"linear layers": layers, "other": other}


def build_models(with_torchao: bool = True) -> tuple[dict[str, CausalLM], dict]:
    """Every scheme's model (quantized ones share the float model's embeddings and norms), and torchao's status."""
    floats = {dtype: minillm.load_model(dtype=dtype) for dtype in ("float32", "bfloat16")}
    models = {}
    for name, (dtype, scheme, group) in SCHEMES.items():
        base = floats[dtype]
        models[name] = base if scheme is None else quantize_model(base, scheme, group or 64)
    peer, status = torchao_int8(floats["float32"]) if with_torchao else (None, {"available": False,
                                                                               "reason": "--no-torchao"})
    if peer is not None:
        models[TORCHAO] = peer
    return models, status


# ----------------------------------------------------------------------------------------------- quality
def cut_prompts(text_ids: list[int], count: int, length: int = PROMPT_TOKENS) -> list[list[int]]:
    """`count` prompts of `length` tokens, starting evenly spread over the text."""
    stride = (len(text_ids) - length) // max(count, 1)
    return [text_ids[i * stride:i * stride + length] for i in range(count)]


def quality(models: dict[str, CausalLM], tokenizer, text_ids: list[int], prompts: list[list[int]],
            agreement_tokens: int, questions: list[tuple[str, str]]) -> dict:
    out, reference = {}, None
    for name, model in tqdm(models.items(), desc="quality"):
        start = time.perf_counter()
        outputs = greedy_outputs(model, tokenizer, prompts, agreement_tokens)
        reference = reference or outputs  # fp32 comes first
        correct, total = arithmetic_accuracy(model, tokenizer, questions)
        out[name] = {"perplexity": perplexity(model, text_ids), "arithmetic_correct": correct,
                     "arithmetic_total": total,
                     "first_divergence": [first_divergence(r, o) for r, o in zip(reference, outputs)],
                     "mean_agreement": mean(agreement(r, o) for r, o in zip(reference, outputs)),
                     "seconds": time.perf_counter() - start}
    for row in out.values():
        row["perplexity_ratio"] = row["perplexity"] / out["fp32"]["perplexity"]
    return out


def sizes(models: dict[str, CausalLM]) -> dict:
    out = {}
    for name, model in models.items():
        counted = torchao_weight_bytes(model) if name == TORCHAO else weight_bytes(model)
        out[name] = {"linear_bytes": counted["linear layers"], "total_bytes": sum(counted.values())}
    for row in out.values():
        row["linear_ratio"] = row["linear_bytes"] / out["fp32"]["linear_bytes"]
        row["total_ratio"] = row["total_bytes"] / out["fp32"]["total_bytes"]
    return out


def weight_error(model: CausalLM) -> dict[str, float]:
    """Relative error of the decoder matmuls' weights, ||W - dequantized|| / ||W|| over all of them, for int8
    with one scale per tensor (the baseline an outlier ruins), per output channel, and int4 per group."""
    schemes = {"int8 per tensor": quantize_per_tensor_int8, "int8 per channel": lambda w: quantize_int8(w).dequantize(),
               **{f"int4 g{g}": functools.partial(lambda w, g: quantize_int4(w, g).dequantize(), g=g)
                  for g in (32, 64, 128)}}
    errors = dict.fromkeys(schemes, 0.0)
    norm = 0.0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in QUANTIZED_LAYERS and isinstance(module, nn.Linear):
            w = module.weight.detach().float()
            norm += w.pow(2).sum().item()
            for scheme, round_trip in schemes.items():
                errors[scheme] += (round_trip(w) - w).pow(2).sum().item()
    return {scheme: (error / norm) ** 0.5 for scheme, error in errors.items()}


# ----------------------------------------------------------------------------------------------- speed
def decode_run(engine: LLMEngine, prompt: list[int], batch: int, tokens: int) -> float:
    """`batch` copies of `prompt`, `tokens` greedy tokens each: the median ms of the steps in which all decoded."""
    params = SamplingParams(temperature=0, max_new_tokens=tokens, ignore_eos=True)
    first = engine.trace.next_step
    ids = [engine.add_request(prompt, params).request_id for _ in range(batch)]
    while engine.has_unfinished():
        engine.step()
    for i in ids:
        engine.release(i)
    steps = [s.duration for s in engine.trace.steps if s.step >= first and s.decode_tokens == batch
             and s.num_tokens == batch]
    return median(steps) * 1e3


def speed(models: dict[str, CausalLM], tokenizer, prompt: list[int], tokens: int, rounds: int) -> dict:
    """Each scheme's decode step at each batch size, its engine run once per round, rounds interleaved."""
    engines = {name: LLMEngine(model, tokenizer, EngineConfig(kv="paged", max_num_seqs=max(BATCHES),
                                                              max_model_len=len(prompt) + tokens + 16))
               for name, model in models.items()}
    out: dict = {"tokens": tokens,
                 "attention": {name: e.cache.ops.__name__.rsplit(".", 1)[-1] for name, e in engines.items()}}
    for batch in BATCHES:
        print(f"decode steps at batch {batch}:", flush=True)
        for engine in engines.values():  # warm-up: first-call packing and allocation, unrecorded
            decode_run(engine, prompt, batch, 4)
        runs: dict[str, Callable[[], float]] = {name: functools.partial(decode_run, engine, prompt, batch, tokens)
                                                for name, engine in engines.items()}
        trials = interleaved(runs, rounds, rerun="benchmarks/quantization.py")
        rows = {}
        for name in engines:
            rows[name] = {"step_ms": trials.median(name), "rounds_ms": trials.values(name),
                          "vs_fp32": trials.ratio(name, "fp32").value, "vs_bf16": trials.ratio(name, "bf16").value}
        out[str(batch)] = {"rows": rows, "warning": trials.warning(), "cpu": trials.cpu.describe()}
        for name, row in rows.items():
            print(f"  {name:16s} {row['step_ms']:8.2f} ms  x{row['vs_fp32']:.2f} of fp32  "
                  f"x{row['vs_bf16']:.2f} of bf16")
        if trials.warning():
            print("  " + trials.warning())
    for engine in engines.values():
        engine.close()
    return out


# ----------------------------------------------------------------------------------------------- KV cache
def kv_capacity(floats: dict[str, CausalLM], tokenizer, text_ids: list[int], args) -> dict:
    """Each KV cache through one byte budget on long-context requests: tokens that fit, peak concurrency, and
    each request's first divergence from the float32 cache."""
    config = floats["float32"].config
    per_request = args.kv_prompt + args.kv_output
    fp32_per_token = kv_bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim, torch.float32)
    budget = args.kv_fp32_requests * per_request * fp32_per_token
    looped = text_ids * 2  # prompts longer than half the text start late in it and wrap around
    stride = max((len(text_ids) - 1) // args.kv_requests, 1)
    prompts = [looped[i * stride:i * stride + args.kv_prompt] for i in range(args.kv_requests)]
    params = SamplingParams(temperature=0, max_new_tokens=args.kv_output, ignore_eos=True)
    out: dict = {"budget_bytes": budget, "requests": len(prompts), "prompt_tokens": args.kv_prompt,
                 "output_tokens": args.kv_output, "caches": {}}
    reference = None
    for name, (dtype, kv_dtype) in tqdm(KV_CACHES.items(), desc="KV capacity"):
        model = floats[dtype]
        engine = LLMEngine(model, tokenizer, EngineConfig(kv="paged", max_num_seqs=256, max_model_len=per_request,
                                                          kv_cache_bytes=budget, use_cpu_kernel=False,
                                                          kv_cache_dtype=kv_dtype))
        start = time.perf_counter()
        ids = [engine.add_request(p, params).request_id for p in prompts]
        while engine.has_unfinished():
            engine.step()
        took = time.perf_counter() - start
        outputs = [list(engine.output(i).token_ids) for i in ids]
        for i in ids:
            engine.release(i)
        reference = reference or outputs
        concurrent = [len(s.kv_tokens) for s in engine.trace.steps]
        divergences = [first_divergence(r, o) for r, o in zip(reference, outputs)]
        out["caches"][name] = {
            "bytes_per_token": engine.cache.bytes_per_token, "tokens_in_budget": engine.pool.num_blocks
            * engine.pool.block_size, "peak_concurrent_requests": max(concurrent),
            "preemptions": engine.num_preemptions, "seconds": took, "first_divergence": divergences,
            "identical_requests": sum(d is None for d in divergences)}
        engine.close()
    base = out["caches"]["auto (fp32)"]
    bf16 = out["caches"]["auto (bf16 model)"]
    for row in out["caches"].values():
        row["tokens_vs_fp32"] = row["tokens_in_budget"] / base["tokens_in_budget"]
        row["tokens_vs_bf16"] = row["tokens_in_budget"] / bf16["tokens_in_budget"]
        row["peak_vs_fp32"] = row["peak_concurrent_requests"] / base["peak_concurrent_requests"]
        row["peak_vs_bf16"] = row["peak_concurrent_requests"] / bf16["peak_concurrent_requests"]
    return out


def kv_agreement(floats: dict[str, CausalLM], tokenizer, prompts: list[list[int]], tokens: int) -> dict:
    """The greedy-agreement prompts decoded with each cache, against the float32 cache (torch reference)."""
    outputs = {name: greedy_outputs(floats[dtype], tokenizer, prompts, tokens, kv_cache_dtype=kv_dtype,
                                    use_cpu_kernel=False)
               for name, (dtype, kv_dtype) in tqdm(KV_CACHES.items(), desc="KV agreement")}
    reference = outputs["auto (fp32)"]
    return {name: {"first_divergence": [first_divergence(r, o) for r, o in zip(reference, outs)],
                   "mean_agreement": mean(agreement(r, o) for r, o in zip(reference, outs))}
            for name, outs in outputs.items()}


# ----------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48, help="decode-timing tokens per request")
    parser.add_argument("--prompts", type=int, default=8, help="greedy-agreement prompts")
    parser.add_argument("--agreement-tokens", type=int, default=256)
    parser.add_argument("--kv-prompt", type=int, default=992)
    parser.add_argument("--kv-output", type=int, default=32)
    parser.add_argument("--kv-requests", type=int, default=40)
    parser.add_argument("--kv-fp32-requests", type=int, default=8, help="the byte budget, in fp32 requests")
    parser.add_argument("--no-torchao", action="store_true", help="leave torchao out even where it is installed")
    parser.add_argument("--quick", action="store_true", help="a short run (smaller everything; not saved over "
                                                             "the full results unless --save)")
    parser.add_argument("--save", action="store_true", help="with --quick: write the results anyway")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    path = RESULTS / "quantization.json"
    if args.plot_only:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    if args.quick:
        args.rounds, args.tokens, args.prompts, args.agreement_tokens = 2, 16, 2, 32
        args.kv_prompt, args.kv_output, args.kv_requests, args.kv_fp32_requests = 240, 16, 10, 2
    started = time.perf_counter()
    tokenizer = minillm.load_tokenizer()
    text_ids = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    models, torchao_status = build_models(with_torchao=not args.no_torchao)
    print(f"{len(models)} weight schemes; torchao: {torchao_status}", flush=True)
    prompts = cut_prompts(text_ids, args.prompts)
    questions = arithmetic_questions()
    if args.quick:
        questions = questions[::5]
    saved = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
                   f"torch {torch.__version__}, CPU kernels for {torch.backends.cpu.get_cpu_capability()}",
        "quick": args.quick, "rounds": args.rounds, "prompt_tokens": PROMPT_TOKENS,
        "heldout_tokens": len(text_ids), "agreement_prompts": len(prompts),
        "agreement_tokens": args.agreement_tokens, "torchao": torchao_status,
        "quality": quality(models, tokenizer, text_ids, prompts, args.agreement_tokens, questions),
        "size": sizes(models), "weight_error": weight_error(models["fp32"])}
    for name, row in saved["quality"].items():
        print(f"  {name:16s} ppl x{row['perplexity_ratio']:.4f}  arithmetic {row['arithmetic_correct']}/"
              f"{row['arithmetic_total']}  first divergence {row['first_divergence']}  "
              f"linear {saved['size'][name]['linear_bytes'] / 2**20:.2f} MiB", flush=True)
    print("  relative weight error:", {k: round(v, 5) for k, v in saved["weight_error"].items()}, flush=True)
    saved["speed"] = speed(models, tokenizer, prompts[0], args.tokens, args.rounds)
    floats = {"float32": models["fp32"], "bfloat16": models["bf16"]}
    saved["kv"] = kv_capacity(floats, tokenizer, text_ids, args)
    saved["kv"]["agreement"] = kv_agreement(floats, tokenizer, prompts, args.agreement_tokens)
    for name, row in saved["kv"]["caches"].items():
        print(f"  KV {name:18s} {row['tokens_in_budget']:6d} tokens (x{row['tokens_vs_fp32']:.2f} of fp32), peak "
              f"{row['peak_concurrent_requests']} requests; first divergence "
              f"{saved['kv']['agreement'][name]['first_divergence']}", flush=True)
    saved["seconds"] = time.perf_counter() - started
    print(f"took {saved['seconds']:.0f} s")
    if args.quick and not args.save:
        return
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(saved, indent=1) + "\n")
    plot(saved, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


def divergence_dots(ax, x: float, firsts: list[int | None], limit: int, colour: str) -> None:
    """One prompt's first divergent token per dot, spread sideways; prompts that never diverged sit on the
    `limit` line, and their count is written above it."""
    spread = [x + 0.3 * (j / max(len(firsts) - 1, 1) - 0.5) for j in range(len(firsts))]
    ax.scatter(spread, [limit if d is None else d for d in firsts], s=16, alpha=0.75, color=colour)
    ax.annotate(f"{sum(d is None for d in firsts)}/{len(firsts)}", (x, limit), xytext=(0, 4),
                textcoords="offset points", ha="center", fontsize=7)


def plot(saved: dict, path: Path) -> None:
    """Six panels: perplexity and arithmetic, greedy agreement, weight bytes, decode steps, KV capacity and
    KV agreement."""
    quality, size, speed_, kv = saved["quality"], saved["size"], saved["speed"], saved["kv"]
    names = list(quality)
    colours = {name: ("#555" if name in ("fp32", "bf16") else "#c60" if "torchao" in name
                      else "#2a7" if name.startswith("bf16 +") else "#37b") for name in names}
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    xs = range(len(names))

    ax = axes[0, 0]
    change = [100 * (quality[n]["perplexity_ratio"] - 1) for n in names]
    bars = ax.bar(xs, change, color=[colours[n] for n in names])
    for bar, n in zip(bars, names):
        q = quality[n]
        ax.annotate(f"{q['arithmetic_correct']}/{q['arithmetic_total']}", (bar.get_x() + bar.get_width() / 2,
                    max(bar.get_height(), 0)), ha="center", va="bottom", fontsize=7)
    ax.axhline(0, color="#888", lw=0.8)
    ax.set(xticks=xs, ylabel="perplexity vs fp32 (%)",
           title="held-out perplexity (labels: arithmetic correct)")
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)

    ax = axes[0, 1]
    limit = saved["agreement_tokens"]
    for i, n in enumerate(names):
        divergence_dots(ax, i, quality[n]["first_divergence"], limit, colours[n])
    ax.axhline(limit, color="#888", lw=0.8, ls=":")
    ax.set(xticks=xs, ylim=(-8, limit * 1.12), ylabel="first divergent token",
           title=f"first divergence from fp32's greedy tokens (top: none in {limit})")
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)

    ax = axes[0, 2]
    linear = [size[n]["linear_bytes"] / 2**20 for n in names]
    total = [size[n]["total_bytes"] / 2**20 for n in names]
    ax.bar(xs, total, color="none", edgecolor="#888", label="whole model")
    bars = ax.bar(xs, linear, color=[colours[n] for n in names], label="decoder matmuls")
    for bar, n in zip(bars, names):
        ax.annotate(f"x{size[n]['linear_ratio']:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set(xticks=xs, ylabel="MiB", title="weight bytes (ratio: matmuls vs fp32)")
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.legend(fontsize=7)

    ax = axes[1, 0]
    timed = [n for n in names if n in speed_["1"]["rows"]]
    width = 0.4
    for j, batch in enumerate(BATCHES):
        ratios = [speed_[str(batch)]["rows"][n]["vs_fp32"] for n in timed]
        bars = ax.bar([i + (j - 0.5) * width for i in range(len(timed))], ratios, width=width,
                      color="#37b" if batch == 1 else "#b43", label=f"batch {batch}")
        for bar, r in zip(bars, ratios):
            ax.annotate(f"{r:.2g}", (bar.get_x() + bar.get_width() / 2, r), ha="center", va="bottom", fontsize=6)
    ax.axhline(1, color="#888", lw=0.8)
    ax.set(xticks=range(len(timed)), ylabel="decode step / fp32's",
           title="decode step time, median of interleaved rounds")
    ax.set_xticklabels(timed, rotation=35, ha="right", fontsize=8)
    ax.legend(fontsize=7)

    ax = axes[1, 1]
    caches = list(kv["caches"])
    for j, (key, label) in enumerate((("tokens_vs_fp32", "tokens in the budget"),
                                      ("peak_vs_fp32", "peak concurrent requests"))):
        values = [kv["caches"][c][key] for c in caches]
        bars = ax.bar([i + (j - 0.5) * width for i in range(len(caches))], values, width=width,
                      color="#37b" if j == 0 else "#2a7", label=label)
        for bar, v in zip(bars, values):
            ax.annotate(f"x{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.set(xticks=range(len(caches)), ylabel="vs the fp32 cache",
           title=f"KV cache: one budget ({kv['budget_bytes'] / 2**20:.0f} MiB), {kv['requests']} requests of "
                 f"{kv['prompt_tokens']}+{kv['output_tokens']} tokens")
    ax.set_xticklabels(caches, fontsize=8)
    ax.legend(fontsize=7)

    ax = axes[1, 2]
    for i, c in enumerate(caches):
        divergence_dots(ax, i, kv["agreement"][c]["first_divergence"], limit, "#37b")
    ax.axhline(limit, color="#888", lw=0.8, ls=":")
    ax.set(xticks=range(len(caches)), ylim=(-8, limit * 1.12), ylabel="first divergent token",
           title="first divergence from the fp32 cache's greedy tokens")
    ax.set_xticklabels(caches, fontsize=8)
    fig.suptitle("Quantization on the shipped target: quality, bytes, decode time, KV capacity "
                 f"({'quick run' if saved.get('quick') else 'full run'}; {saved['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
