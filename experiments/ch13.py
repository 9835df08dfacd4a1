"""Chapter 13's experiments: one model across several processes, and prefill apart from decode.

    ModelShape, REAL_MODELS   real models' published shapes; their parameters and KV bytes computed from them
    memory_table              what one GPU holds of each: weights, KV per token, the fewest GPUs for the weights
    split_layer               a real MLP of the shipped model split by columns, then by rows: the one sum it needs
    head_placement            which query and KV heads each rank holds (KV heads replicated past their count)
    tp_runs                   the engine at several tensor-parallel sizes beside the naive loop: the same tokens,
                              each rank's bytes, and the collectives of a real run (for the lanes widget)
    link_table                an all-reduce's time per decode step on real links, from bytes and bandwidth
    disaggregated_run         a prefill engine and a decode engine beside one engine: the same text, the K/V
                              transfers, and the lanes of both workers
    saved                     the benchmarks' saved results, with the words they support
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
GIB = 2**30


# ------------------------------------------------------------------------------------- when one is not enough
@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False

    @property
    def parameters(self) -> int:
        """Embeddings (and an untied LM head), per layer q/k/v/o and the gated MLP's three matrices, the norms."""
        attention = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * \
            self.hidden
        mlp = 3 * self.hidden * self.intermediate
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * (attention + mlp + 2 * self.hidden) + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


REAL_MODELS = (  # the shapes their config.json files publish
    ModelShape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256),
    ModelShape("Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936),
    ModelShape("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256),
    ModelShape("Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256),
)


def memory_table(gpu_gb: float = 80.0, context: int = 32768, dtype_bytes: int = 2) -> list[list[str]]:
    """Per model: parameters, weights in bfloat16, KV per token and per `context`-token request, the fewest GPUs
    of `gpu_gb` (10^9 bytes, as GPUs are sold) whose memory holds the weights (90% usable) — a power of two,
    as tensor-parallel sizes must divide the heads — and the requests of `context` tokens that then fit beside
    the weights on that many GPUs."""
    rows = []
    for shape in REAL_MODELS:
        weights = shape.parameters * dtype_bytes
        per_token = shape.kv_bytes_per_token(dtype_bytes)
        usable = 0.9 * gpu_gb * 1e9
        gpus = 1
        while weights > gpus * usable:
            gpus *= 2
        requests = int((gpus * usable - weights) // (per_token * context))
        rows.append([shape.name, f"{shape.parameters / 1e9:.1f} B", f"{weights / 1e9:.0f} GB",
                     f"{per_token / 1024:.0f} KiB", f"{per_token * context / 1e9:.1f} GB", str(gpus), str(requests)])
    return rows


# ------------------------------------------------------------------------------------------ splitting a layer
def split_layer(mlp, x: torch.Tensor, size: int) -> dict[str, float]:
    """The gated MLP `mlp` (gate_up_proj, then down_proj) run whole and as `size` shards: gate_up split by its
    output rows (column-parallel: each shard's gate and up rows, no exchange), down_proj by its input columns
    (row-parallel: partial sums), one sum at the end. Returns the largest differences from the whole layer."""
    import torch.nn.functional as F

    from minillm.distributed.sharding import TensorShard
    from minillm.model.config import ModelConfig

    inter, hidden = mlp.intermediate_size, x.shape[-1]
    config = ModelConfig("llama", 8, hidden, inter, 1, size, size, 2, 8)  # only the MLP's sizes matter here
    gate_up, down = mlp.gate_up_proj.weight.detach(), mlp.down_proj.weight.detach()
    with torch.no_grad():
        whole_gate, whole_up = (x @ gate_up.T).split(inter, dim=-1)
        whole = (F.silu(whole_gate) * whole_up) @ down.T  # (tokens, hidden)
        partials, columns = [], []
        for rank in range(size):
            shard = TensorShard(rank, size)
            gate, up = (x @ shard.shard("mlp.gate_up_proj.weight", gate_up, config).T).split(inter // size, dim=-1)
            h = F.silu(gate) * up  # (tokens, inter / size): this rank's columns of the hidden activation
            columns.append(h)
            partials.append(h @ shard.shard("mlp.down_proj.weight", down, config).T)  # (tokens, hidden): a part
        summed = torch.stack(partials).sum(0)  # the all-reduce
    hidden_whole = F.silu(whole_gate) * whole_up
    return {"columns side by side vs whole": (torch.cat(columns, -1) - hidden_whole).abs().max().item(),
            "partial sums summed vs whole": (summed - whole).abs().max().item(),
            "one partial alone vs whole": (partials[0] - whole).abs().max().item(),
            "whole's largest value": whole.abs().max().item()}


def head_placement(config, sizes: Sequence[int] = (1, 2, 4)) -> list[list[str]]:
    """Per size and rank: its query heads, its KV heads (replicated when there are fewer than ranks), its MLP rows
    and vocabulary rows."""
    from minillm.distributed.sharding import TensorShard

    rows = []
    for size in sizes:
        for rank in range(size):
            shard = TensorShard(rank, size)
            q, kv, mlp, vocab = (shard.q_heads(config), shard.kv_heads(config), shard.mlp_rows(config),
                                 shard.vocab_rows(config))
            replicated = " (replicated)" if config.num_kv_heads < size else ""
            rows.append([f"TP={size}", str(rank), f"{q.start}-{q.stop - 1}", f"{kv.start}-{kv.stop - 1}{replicated}",
                         f"{mlp.start}-{mlp.stop - 1}", f"{vocab.start}-{min(vocab.stop, config.vocab_size) - 1}"])
    return rows


# ------------------------------------------------------------------------------------------------ the engine
@dataclass
class TPRun:
    size: int
    tokens: list[list[int]]
    weight_bytes: int  # rank 0's
    kv_bytes_per_token: int  # per rank
    worker_pids: list[int]
    records: dict | None  # rank -> Collective records of the run (TP > 1)
    allreduce: tuple[int, int, float] | None  # rank 0's all-reduces: (count, bytes, seconds)
    cpu: object  # minillm.timing.CpuUse of the run (the workers are children: their CPU counts as ours)
    wall_s: float

    @property
    def busy(self) -> bool:
        """Whether other programs took cores the ranks needed: every rank runs cores / size threads, so together
        they need every core."""
        return self.cpu.others_cores > 0.25 * self.cpu.cores


def tp_runs(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, sizes: Sequence[int] = (1, 2, 4),
            progress: bool = False, **config) -> list[TPRun]:
    """The same greedy requests through the engine at each tensor-parallel size (paged cache); `progress`: a line
    per size as it finishes."""
    import time

    from minillm.config import EngineConfig
    from minillm.engine import LLMEngine
    from minillm.sampling import SamplingParams
    from minillm.timing import CpuWatch

    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    runs = []
    for size in sizes:
        started = time.perf_counter()
        engine = LLMEngine(model, None, EngineConfig(tensor_parallel_size=size, kv="paged", **config),
                           detokenize=False)
        try:
            if engine.workers is not None:
                engine.workers.drain()  # what the start-up did is not the run's
            began = time.perf_counter()
            with CpuWatch() as watch:  # the workers are children: their CPU counts as ours
                ids = [engine.add_request(list(p), params).request_id for p in prompts]
                while engine.has_unfinished():
                    engine.step()
            wall = time.perf_counter() - began
            tokens = [engine.output(i).token_ids for i in ids]
            for i in ids:
                engine.release(i)
            records = engine.workers.drain() if engine.workers is not None else None
            totals = engine.workers.communicator.totals["all-reduce"] if engine.workers is not None else None
            runs.append(TPRun(size, tokens, sum(p.numel() * p.element_size() for p in engine.model.parameters()),
                              engine.cache.bytes_per_token, [p.pid for p in engine.workers.processes]
                              if engine.workers is not None else [], records,
                              (totals.count, totals.nbytes, totals.seconds) if totals is not None else None,
                              watch.use, wall))
        finally:
            engine.close()
        if progress:
            workers = f"{size - 1} worker process{'es' * (size > 2)}" if size > 1 else "no worker"
            print(f"TP={size}: done in {time.perf_counter() - started:.1f} s ({workers} started and stopped)",
                  flush=True)
    return runs


def step_window(records: dict, steps: float = 3.0) -> float:
    """A replay window holding about `steps` of rank 0's median step (seconds): close enough to see one step's
    collectives."""
    import statistics

    durations = [c.end - c.start for c in records[0] if c.kind == "step"]
    return steps * statistics.median(durations) if durations else 0.01


LINKS = (  # (name, bytes per second one way, a small all-reduce's fixed cost): vendors' bandwidths, and the
    #         order of magnitude of NCCL's latency for a small message on each (an estimate, not a measurement)
    ("NVLink 4 (H100 SXM, NVSwitch)", 450e9, 8e-6),
    ("PCIe 5.0 x16", 64e9, 15e-6),
    ("400 Gb/s InfiniBand / RoCE (between machines)", 50e9, 25e-6),
)


def allreduce_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """A ring all-reduce: each rank sends (and receives) 2 (n - 1) / n of the data, plus a fixed cost."""
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + latency


def link_table(shape: ModelShape, ranks: int, batch: int, dtype_bytes: int = 2,
               measured: tuple[str, float] | None = None) -> list[list[str]]:
    """One decode step of `batch` tokens on `shape` split over `ranks`: its all-reduces' bytes (two per layer of
    batch x hidden numbers) and their time on each link, beside the step's weight reading time on an H100
    (the weights / ranks at 3.35 TB/s). `measured`: a (name, seconds per all-reduce) row from this machine."""
    per_allreduce = batch * shape.hidden * dtype_bytes
    count = 2 * shape.layers
    read = shape.parameters * dtype_bytes / ranks / 3.35e12
    rows = []
    for name, bandwidth, latency in LINKS:
        t = count * allreduce_seconds(per_allreduce, ranks, bandwidth, latency)
        rows.append([name, f"{count} x {per_allreduce / 1024:.0f} KiB", f"{t * 1e3:.2f} ms", f"{read * 1e3:.2f} ms",
                     f"{t / (t + read):.0%}"])
    if measured is not None:
        name, seconds = measured
        t = count * seconds
        rows.append([name, f"{count} x {per_allreduce / 1024:.0f} KiB", f"{t * 1e3:.2f} ms", f"{read * 1e3:.2f} ms",
                     f"{t / (t + read):.0%}"])
    return rows


# ------------------------------------------------------------------------------------------- disaggregation
@dataclass
class DisaggregatedRun:
    texts: list[str]
    single_texts: list[str]
    cached_tokens: list[int]  # per request: prompt tokens the decode engine received instead of computing
    transfers: list  # (KVHandle, when the router forwarded it)
    lane_spans: list  # (lane, kind, start, end, label)


def disaggregated_run(prompts: Sequence[str], max_new_tokens: int, threads: tuple[int, int] = (1, 1)
                      ) -> DisaggregatedRun:
    """The prompts through a DisaggregatedLLM and through one engine (LLM.generate), greedy."""
    from experiments.ch09 import run_async
    from minillm import LLM, EngineConfig, SamplingParams
    from minillm.disagg.router import DisaggregatedLLM

    config = EngineConfig(kv="paged", prefix_cache=True, max_model_len=1024)
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    single = [o.text for o in LLM(config=config).generate(list(prompts), params, use_tqdm=False)]
    pair = DisaggregatedLLM(config=config, threads=threads)
    try:
        async def go():
            return await asyncio.gather(*[pair.submit(p, params) for p in prompts])

        outputs = run_async(go())  # in a helper thread: the notebook's kernel runs an event loop in this one
        return DisaggregatedRun([o.text for o in outputs], single, [o.num_cached_tokens for o in outputs],
                                list(pair.transfers), list(pair.lane_spans))
    finally:
        pair.close()


# ------------------------------------------------------------------------------------------------ saved runs
def saved(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def disaggregated_lanes(run: DisaggregatedRun) -> tuple[list, list]:
    """The lanes widget's data for a disaggregated run: the prefill and decode workers' spans, and an arrow per
    prompt whose blocks travelled (from the send on the prefill lane to the end of its receipt on the decode
    lane: the first "receive KV" span that starts after the router forwarded the handle)."""
    from widgets.rank_lanes import Lane, LaneSpan, Transfer

    names = ("prefill worker", "decode worker")
    lanes = [Lane(name, [LaneSpan(kind, start, end, label) for lane, kind, start, end, label in run.lane_spans
                         if lane == name]) for name in names]
    receipts = sorted((start, end) for lane, kind, start, end, _ in run.lane_spans
                      if lane == "decode worker" and kind == "receive KV")
    transfers, used = [], set()
    for handle, forwarded in sorted(run.transfers, key=lambda t: t[1]):
        if handle.tag is None:
            continue
        match = next(((s, e) for s, e in receipts if s >= forwarded - 1e-3 and (s, e) not in used), None)
        if match is None:
            continue
        used.add(match)
        transfers.append(Transfer("prefill worker", "decode worker", handle.sent_at, match[1],
                                  f"{handle.num_blocks} blocks, {handle.nbytes / 1024:.0f} KiB"))
    return lanes, transfers


def disaggregation_words(saved_run: dict) -> str:
    """What the saved disaggregation benchmark shows, computed from its numbers."""
    rows, ratios, meta = saved_run["rows"], saved_run["ratios"], saved_run["meta"]
    pair = rows["disaggregated"]
    better = ratios["itl_p99_unchunked_vs_disaggregated"]
    vs_chunked = ratios["itl_p99_chunked_vs_disaggregated"]
    ttft = ratios["long_prompt_ttft_disaggregated_vs_unchunked"]
    p50 = ratios["itl_p50_disaggregated_vs_unchunked"]
    words: list[str] = []
    def times(ratio: float) -> str:  # a ratio of old to new latency, in words
        return f"{ratio:.1f}x lower" if ratio >= 1 else f"{1 / ratio:.1f}x higher"

    words.append(f"Over {ratios['repeats']} repeats ({meta['machine']}), the median ratios: the decoders' ITL p99 "
                 f"disaggregated is {times(better)} than on one unchunked engine and {times(vs_chunked)} than with "
                 "chunked prefill")
    words.append(f"their ITL p50 is {p50:.2f}x the single engine's ({'slower' if p50 > 1 else 'faster'}: the decode "
                 "engine has half the cores)")
    words.append(f"the long prompts' TTFT is {ttft:.2f}x the unchunked engine's, each sending "
                 f"{pair['kv_blocks_per_long_prompt']:.0f} blocks "
                 f"({pair['kv_bytes_per_long_prompt'] / 2**20:.1f} MiB) received and stored in "
                 f"{pair['kv_receive_ms_p50']:.1f} ms at the median")
    return "; ".join(words) + "."
