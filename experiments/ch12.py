"""Chapter 12's experiments: quantization on the shipped model's own weights.

    number_formats      what each number format can hold: bits, largest value, the step next to 1.0
    Scheme, quantize    a weight matrix through `bits`-bit codes with one scale per tensor, per output
                        channel or per group of inputs, symmetric or not — any bits, for the chapter's
                        comparisons (the engine's own int8 / int4 are minillm/quantization/formats.py)
    error_grid          relative error and bytes per weight of many schemes on one real matrix
    with_outlier        a copy of a matrix with one weight made large: what per-tensor scales cannot take
    grid_frames         the data of widgets/quantization_grid.py: one frame per scheme, a row's weights
                        beside their codes' values and the levels each group's scale allows
    decode_roofline     a decode step's time from the bytes it reads and the arithmetic it does

Error is relative: the root-mean-square of (dequantized - original) over that of the original.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SCALE_BYTES = 4  # the engine stores its scales (and int4's minima) as float32


# ----------------------------------------------------------------------------------------- number formats
def number_formats() -> list[list[str]]:
    """One row per format: name, bits, largest finite value, the gap between 1.0 and the next value up,
    the smallest positive normal value (floats) — read from torch itself, not typed in."""
    rows = []
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
                        ("fp8 e5m2", torch.float8_e5m2), ("fp8 e4m3", torch.float8_e4m3fn)):
        info = torch.finfo(dtype)
        rows.append([name, str(info.bits), f"{info.max:.4g}", f"{info.eps:.3g}", f"{info.tiny:.3g}"])
    rows.append(["int8 (× a scale)", "8", "127 steps each side", "one step = the scale", "—"])
    rows.append(["int4 (× a scale, + a minimum)", "4", "15 steps", "one step = the scale", "—"])
    return rows


# ------------------------------------------------------------------------------------------------ schemes
@dataclass(frozen=True)
class Scheme:
    """`bits`-bit codes; one scale per "tensor", per "channel" (output row) or per group of `group` inputs;
    symmetric (codes around zero, scale = max|w| / (2^(bits-1) - 1)) or asymmetric (codes 0..2^bits - 1 over
    the run's [min, max], and a minimum stored beside the scale)."""

    bits: int
    granularity: str  # "tensor" | "channel" | "group"
    group: int = 0
    symmetric: bool = True

    @property
    def label(self) -> str:
        where = {"tensor": "per tensor", "channel": "per channel"}.get(self.granularity, f"groups of {self.group}")
        return f"int{self.bits} {where}{'' if self.symmetric else ', asymmetric'}"

    def bytes_per_weight(self, shape: tuple[int, int]) -> float:
        """Codes plus scales (and minima), averaged over the weights of an (N, K) matrix."""
        n, k = shape
        runs = {"tensor": 1, "channel": n, "group": n * (k // max(self.group, 1))}[self.granularity]
        per_run = SCALE_BYTES * (1 if self.symmetric else 2)
        return self.bits / 8 + runs * per_run / (n * k)


def quantize(weight: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """The weight as its codes stand for it (dequantized, float32), runs as the scheme says."""
    w = weight.detach().float()
    n, k = w.shape
    runs = {"tensor": w.reshape(1, -1), "channel": w, "group": w.reshape(n * k // max(scheme.group, 1), -1)}[
        scheme.granularity]
    if scheme.symmetric:
        top = 2 ** (scheme.bits - 1) - 1
        amax = runs.abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
        values = torch.clamp(torch.round(runs / scale), -top, top) * scale
    else:
        levels = 2 ** scheme.bits - 1
        low, high = runs.amin(dim=1, keepdim=True), runs.amax(dim=1, keepdim=True)
        scale = torch.where(high > low, (high - low) / levels, torch.ones_like(low))
        values = torch.clamp(torch.round((runs - low) / scale), 0, levels) * scale + low
    return values.reshape(n, k)


def relative_error(weight: torch.Tensor, approx: torch.Tensor) -> float:
    w = weight.detach().float()
    return float((approx - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt())


def chapter_schemes(group_sizes: Sequence[int] = (128, 64, 32)) -> list[Scheme]:
    """The schemes the chapter compares: 8, 4 and 3 bits, from one scale per tensor to groups of 32
    (symmetric per tensor and channel; asymmetric in groups, as the engine's int4)."""
    schemes = []
    for bits in (8, 4, 3):
        schemes += [Scheme(bits, "tensor"), Scheme(bits, "channel")]
        schemes += [Scheme(bits, "group", g, symmetric=False) for g in group_sizes]
    return schemes


@dataclass(frozen=True)
class SchemeError:
    scheme: Scheme
    error: float
    bytes_per_weight: float


def error_grid(weight: torch.Tensor, schemes: Sequence[Scheme]) -> list[SchemeError]:
    """Each scheme's relative error on `weight`, with the bytes per weight it costs."""
    return [SchemeError(s, relative_error(weight, quantize(weight, s)), s.bytes_per_weight(tuple(weight.shape)))
            for s in schemes]


def with_outlier(weight: torch.Tensor, row: int = 0, column: int = 0, factor: float = 50.0) -> torch.Tensor:
    """A copy with weight[row, column] set to `factor` x the matrix's largest |weight|: the kind of outlier
    large models grow in a few channels (LLM.int8() found them from ~6.7B parameters on)."""
    w = weight.detach().float().clone()
    w[row, column] = factor * w.abs().max()
    return w


def outlier_ratio(weight: torch.Tensor) -> torch.Tensor:
    """(N,) each output row's largest |weight| over its median |weight|."""
    w = weight.detach().float().abs()
    return w.amax(dim=1) / w.median(dim=1).values


# ------------------------------------------------------------------------------------------ widget frames
@dataclass(frozen=True)
class GridFrame:
    """One scheme on one row of a real matrix: what widgets/quantization_grid.py draws."""

    label: str
    bits: int
    bytes_per_weight: float
    error: float  # over the whole matrix
    values: tuple[float, ...]  # the row's first weights
    quantized: tuple[float, ...]  # what their codes stand for
    levels: tuple[tuple[int, int, tuple[float, ...]], ...]  # (first, last + 1, the values codes can take) per run
    all_errors: tuple[tuple[str, float, float], ...]  # every scheme's (label, bytes per weight, error)


def grid_frames(weight: torch.Tensor, row: int, schemes: Sequence[Scheme], width: int = 128) -> list[GridFrame]:
    """One frame per scheme: row `row`'s first `width` weights, their quantized values, the grid of values
    each run's scale allows over them, and every scheme's error against its bytes (for the scatter)."""
    w = weight.detach().float()
    grid = error_grid(w, schemes)
    everyone = tuple((e.scheme.label, e.bytes_per_weight, e.error) for e in grid)
    frames = []
    for entry in grid:
        s = entry.scheme
        q = quantize(w, s)
        values, quantized = w[row, :width], q[row, :width]
        if s.granularity == "group":
            runs = [(start, min(start + s.group, width)) for start in range(0, width, s.group)]
        else:
            runs = [(0, width)]
        levels = []
        for start, end in runs:
            levels.append((start, end, tuple(_levels(w, row, start, s))))
        frames.append(GridFrame(s.label, s.bits, entry.bytes_per_weight, entry.error,
                                tuple(values.tolist()), tuple(quantized.tolist()), tuple(levels), everyone))
    return frames


def _levels(w: torch.Tensor, row: int, column: int, s: Scheme) -> list[float]:
    """The values the codes of the run holding w[row, column] can stand for."""
    if s.granularity == "tensor":
        run = w.reshape(-1)
    elif s.granularity == "channel":
        run = w[row]
    else:
        first = column - column % s.group
        run = w[row, first:first + s.group]
    if s.symmetric:
        top = 2 ** (s.bits - 1) - 1
        amax = float(run.abs().max())
        scale = amax / top if amax > 0 else 1.0
        return [code * scale for code in range(-top, top + 1)]
    count = 2 ** s.bits - 1
    low, high = float(run.min()), float(run.max())
    scale = (high - low) / count if high > low else 1.0
    return [low + code * scale for code in range(count + 1)]


# ------------------------------------------------------------------------------------------------ roofline
@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s


DEVICES = (Device("a laptop CPU", 50e9, 0.3e12), Device("an NVIDIA H200", 4.8e12, 989e12))


def decode_roofline(params: float, bytes_per_weight: float, batch: int, context: int, kv_bytes_per_token: float,
                    device: Device) -> dict[str, float]:
    """A decode step's lower bound on `device`: it reads every weight once and every running request's
    cached K/V, and does 2 FLOPs per weight per request; the step takes the longer of the two times."""
    read = params * bytes_per_weight + batch * context * kv_bytes_per_token
    flops = 2 * params * batch
    memory_s, compute_s = read / device.bandwidth, flops / device.flops
    return {"bytes": read, "flops": flops, "memory_s": memory_s, "compute_s": compute_s,
            "step_s": max(memory_s, compute_s), "bound": "memory" if memory_s >= compute_s else "compute"}


# ------------------------------------------------------------------------------------------- live timing
def decode_step_ms(engine, prompt_ids: Sequence[int], batch: int, tokens: int = 24) -> float:
    """The median all-decode step (ms) of `batch` greedy requests decoding `tokens` tokens each."""
    import statistics

    from minillm.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_new_tokens=tokens, ignore_eos=True)
    first = engine.trace.next_step
    ids = [engine.add_request(list(prompt_ids), params).request_id for _ in range(batch)]
    while engine.has_unfinished():
        engine.step()
    for request_id in ids:
        engine.release(request_id)
    steps = [s.duration for s in engine.trace.steps if s.step >= first and s.decode_tokens == batch
             and s.num_tokens == batch]
    return statistics.median(steps) * 1e3


def decode_speed(engines: dict, prompt_ids: Sequence[int], batches: Sequence[int] = (1, 16), tokens: int = 24,
                 rounds: int = 3, baseline: str = "fp32", judged: Sequence[int] = (1,)):
    """Each engine's decode step at each batch size, interleaved over `rounds` after a warm-up, as ratios to
    `baseline`'s step in the same round. The guard judges the ratios at the `judged` batch sizes (the chapter's
    claim: quantized steps are shorter there); the others are reported, not judged — near 1 their rounds may
    fall either side of it on a quiet machine. A Finding: its table rows in numbers["rows"]."""
    from experiments import Finding
    from minillm.timing import PairedRatio, interleaved

    runs = {f"{name} @{batch}": (lambda e=engine, b=batch: decode_step_ms(e, prompt_ids, b, tokens))
            for batch in batches for name, engine in engines.items()}
    trials = interleaved(runs, rounds, warmup=True, rerun="this cell")
    rows, words = [], []
    for batch in batches:
        for name in engines:
            what = f"{name}'s decode step at batch {batch} against {baseline}'s"
            if name == baseline:
                ratio = None
            elif batch in judged:
                ratio = trials.ratio(f"{name} @{batch}", f"{baseline} @{batch}", what=what)
            else:
                ratio = PairedRatio(f"{name} @{batch}", f"{baseline} @{batch}", tuple(
                    a / b for a, b in zip(trials.values(f"{name} @{batch}"), trials.values(f"{baseline} @{batch}"))),
                    what)
            rows.append([name, str(batch), f"{trials.median(f'{name} @{batch}'):.2f} ms",
                         "1.00x" if ratio is None else f"{ratio.value:.2f}x",
                         "" if ratio is None else ratio.rounds()])
            if ratio is not None:
                words.append(f"{name} at batch {batch}: {ratio.value:.2f}x")
    text = (f"Decode step time against {baseline}'s, the median of {rounds} interleaved rounds: "
            + "; ".join(words) + ".")
    return Finding(text, True, {"rows": rows}, trials)


# ------------------------------------------------------------------------------------------- engine runs
def run_greedy(engine, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Every prompt's greedy tokens (no stop at the end-of-text token), the requests released after
    (minillm/quantization/quality.py::engine_outputs)."""
    from minillm.quantization.quality import engine_outputs
    from minillm.sampling import SamplingParams

    return engine_outputs(engine, prompts, SamplingParams(temperature=0, max_new_tokens=max_new_tokens,
                                                          ignore_eos=True))


@dataclass(frozen=True)
class Capacity:
    kv_cache_dtype: str
    bytes_per_token: int
    blocks: int
    peak_running: int  # the most requests decoding in one step
    preemptions: int


def kv_capacity(model, tokenizer, kv_cache_dtype: str, budget: int, prompts: Sequence[Sequence[int]],
                max_new_tokens: int, block_size: int = 16) -> tuple[Capacity, list[list[int]]]:
    """The same long-context requests through a paged cache of `budget` bytes holding `kv_cache_dtype`: how many
    ran at once at most (and how often one was preempted), and their greedy tokens."""
    from minillm.config import EngineConfig
    from minillm.engine import LLMEngine

    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=len(prompts), max_model_len=512, kv="paged",
                                                      block_size=block_size, kv_cache_bytes=budget,
                                                      kv_cache_dtype=kv_cache_dtype))
    first = engine.trace.next_step
    outputs = run_greedy(engine, prompts, max_new_tokens)
    peak = max(step.busy_slots for step in engine.trace.steps if step.step >= first)
    return Capacity(kv_cache_dtype, engine.cache.bytes_per_token, engine.pool.num_blocks, peak,
                    engine.num_preemptions), outputs



# ----------------------------------------------------------------------------------------- saved results
def saved_words(saved: dict) -> str:
    """What benchmarks/results/quantization.json says, computed from whatever it holds."""
    parts = [f"Saved by benchmarks/quantization.py on {saved.get('machine', 'an unnamed machine')}"
             f"{' (a quick run)' if saved.get('quick') else ''}, {saved.get('rounds', '?')} interleaved rounds."]
    quality = saved.get("quality", {})
    if quality:
        parts.append("Perplexity against fp32's: " + ", ".join(
            f"{name} {row['perplexity_ratio'] - 1:+.2%}" for name, row in quality.items() if name != "fp32") + ".")
    speed = saved.get("speed", {})
    for batch in ("1", "16"):
        rows = speed.get(batch, {}).get("rows", {})
        if rows:
            parts.append(f"Decode step at batch {batch} against fp32's: " + ", ".join(
                f"{name} {row['vs_fp32']:.2f}x" for name, row in rows.items() if name != "fp32") + ".")
    torchao = saved.get("torchao", {})
    if torchao:
        parts.append(f"(torchao {torchao.get('version', '')}: {torchao.get('config', torchao.get('reason', ''))}.)")
    caches = saved.get("kv", {}).get("caches", {})
    if caches:
        budget = saved["kv"].get("budget_bytes", 0) / 2**20
        parts.append(f"KV cache in {budget:g} MiB: " + ", ".join(
            f"{name} {row['tokens_in_budget']:,} tokens, at most {row['peak_concurrent_requests']} requests at once"
            for name, row in caches.items()) + ".")
    return " ".join(parts)
