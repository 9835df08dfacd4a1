"""Chapter 8 on a GPU: CUDA Graphs against eager on real model shapes (random weights), in one run.

    python benchmarks/gpu_graphs.py                 (on a machine with an NVIDIA GPU; scripts/gpu_check.sh runs it)
    python benchmarks/gpu_graphs.py --dry-run       (tiny shapes on the CPU, eager only: checks the script itself)

  1. the launch timeline: one batch-1 decode step of the shipped target profiled eagerly and replayed
     from a graph (host calls and GPU kernels) -> benchmarks/results/launch_timeline_cuda.json, which
     chapter 8 draws;
  2. batch-1 TPOT of a Qwen2.5-0.5B-shaped model (bfloat16, random weights): eager vs CUDA Graphs
     (for scale: vLLM reports about 1.7 ms per token for Qwen2.5-0.5B at batch 1 on an H100 PCIe);
  3. a throughput workload in the shape of published ones: 256 requests, prompt and output lengths
     uniform in [100, 1024], a Qwen3-0.6B-shaped model (bfloat16, random weights), CUDA Graphs on; output
     tok/s, and its fraction of the memory roofline: for every decode step, the bytes it must read
     (all weights, plus the K/V of every running request) over the measured copy bandwidth, summed,
     against the time the steps took (nano-vllm reports 1,434 tok/s for this workload on a laptop RTX 4070).
Results: benchmarks/results/gpu_graphs.json (a dry run writes nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from statistics import median

import torch

import minillm
from minillm.attention.paged import kv_bytes_per_token
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.graphs.step_profile import profile_step, save_profiles
from minillm.model.config import ModelConfig
from minillm.model.decoder import CausalLM
from minillm.sampling import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"
KV_BYTES = 1 << 30  # the small engines' KV cache (the throughput engine takes most of the free memory)
SHAPES = {  # the published configurations' shapes
    "qwen2.5-0.5b": dict(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                         num_heads=14, num_kv_heads=2, head_dim=64, max_position_embeddings=32768,
                         rope_theta=1e6, tie_word_embeddings=True, qkv_bias=True),
    "qwen3-0.6b": dict(family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                       num_heads=16, num_kv_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1e6,
                       tie_word_embeddings=True, qk_norm=True),
    "tiny": dict(family="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True, qk_norm=True),
}


class IdTokenizer:
    """A tokenizer for random models: the text of a token is its id."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(f" {i}" for i in ids)


def random_model(shape: str, device: str, dtype: torch.dtype) -> CausalLM:
    """A model of a published shape with random weights, built directly on the device."""
    torch.manual_seed(0)
    with torch.device(device):
        model = CausalLM(ModelConfig(**SHAPES[shape]))
    return model.to(dtype).eval()


def launch_timeline(device: str, graphs: bool) -> list[dict]:
    model, tokenizer = minillm.load_model(device=device, dtype="bfloat16"), minillm.load_tokenizer()
    profiles = []
    for label, flags in [("eager, batch 1", {}), ("CUDA Graph replay, batch 1", {"cuda_graphs": True})][: 1 + graphs]:
        engine = LLMEngine(model, tokenizer, EngineConfig(kv="paged", max_num_seqs=4, max_model_len=512,
                                                          kv_cache_bytes=KV_BYTES, **flags))
        engine.add_request(list(range(10, 74)), SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True))
        for _ in range(10):
            engine.step()
        profiles.append(profile_step(engine.step, label))
        while engine.has_unfinished():
            engine.step()
    save_profiles(profiles, RESULTS / "launch_timeline_cuda.json")
    summary = [{"label": p.label, "host_calls": p.num_host_ops, "kernels": p.num_kernels, "step_us": p.wall_us}
               for p in profiles]
    print("launch timeline:", summary)
    return summary


def batch1_tpot(shape: str, device: str, dtype: torch.dtype, graphs: bool, new_tokens: int) -> dict:
    model = random_model(shape, device, dtype)
    rng = random.Random(0)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(128)] for _ in range(4)]
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    row = {"shape": shape}
    for name, flags in [("eager", {}), ("cuda_graphs", {"cuda_graphs": True})][: 1 + graphs]:
        engine = LLMEngine(model, IdTokenizer(), EngineConfig(kv="paged", max_num_seqs=8, max_model_len=2048,
                                                               kv_cache_bytes=KV_BYTES, device=device, **flags))
        tpots = []
        for i, prompt in enumerate([prompts[0][:16], *prompts]):  # the first: a warm-up
            request_id = engine.add_request(prompt, params).request_id
            while engine.has_unfinished():
                engine.step()
            if i:
                tpots.append(engine.output(request_id).metrics.tpot)
            engine.release(request_id)
        row[f"{name}_tpot_ms"] = median(tpots) * 1e3
    if graphs:
        row["graphs_speedup"] = row["eager_tpot_ms"] / row["cuda_graphs_tpot_ms"]
    print("batch-1 TPOT:", row)
    del model
    return row


def copy_bandwidth(device: str) -> float:
    """Bytes per second a device-to-device copy moves (each byte read once and written once)."""
    if device == "cpu":
        return 20e9
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * 10 * src.numel() / (time.perf_counter() - start)


def throughput(shape: str, device: str, dtype: torch.dtype, graphs: bool, num_requests: int, low: int,
               high: int) -> dict:
    if device == "cuda":  # what the earlier engines cached is free now: the KV budget is measured from it
        torch.cuda.empty_cache()
    model = random_model(shape, device, dtype)
    c = model.config
    rng = random.Random(0)
    work = [([rng.randrange(c.vocab_size) for _ in range(rng.randint(low, high))], rng.randint(low, high))
            for _ in range(num_requests)]
    config = EngineConfig(kv="paged", max_num_seqs=min(256, num_requests), max_model_len=2 * high,
                          max_tokens_per_step=16384, device=device, cuda_graphs=graphs)
    engine = LLMEngine(model, IdTokenizer(), config)
    warm = engine.add_request(work[0][0][:32], SamplingParams(temperature=0, max_new_tokens=8)).request_id
    while engine.has_unfinished():
        engine.step()
    engine.release(warm)
    first = engine.trace.next_step
    start = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)).request_id
           for p, n in work]
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - start
    outputs = sum(len(engine.output(i).token_ids) for i in ids)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    per_token = kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, dtype)
    bandwidth = copy_bandwidth(device)
    floor = spent = 0.0
    for step in engine.trace.steps:
        if step.step < first or step.prefill_tokens or not step.decode_tokens:
            continue
        floor += (weight_bytes + per_token * sum(step.kv_tokens.values())) / bandwidth
        spent += step.duration
    row = {"shape": shape, "requests": num_requests, "output_tokens": outputs, "seconds": elapsed,
           "output_tok_per_s": outputs / elapsed, "copy_bandwidth_GBps": bandwidth / 1e9,
           "decode_steps_roofline_fraction": floor / spent if spent else None,
           "recorded_steps": sum(1 for s in engine.trace.steps if s.step >= first and s.recorded_batch)}
    print("throughput:", row)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, eager only")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.dry_run:
        device, graphs, dtype = "cpu", False, torch.float32
        tpot_shape, load_shape, n, low, high, new_tokens = "tiny", "tiny", 8, 10, 40, 16
    else:
        assert torch.cuda.is_available(), "no CUDA GPU: use --dry-run to check the script on a CPU"
        device, graphs, dtype = "cuda", True, torch.bfloat16
        tpot_shape, load_shape, n, low, high, new_tokens = "qwen2.5-0.5b", "qwen3-0.6b", 256, 100, 1024, 256
    saved = {"gpu": torch.cuda.get_device_name() if device == "cuda" else None, "torch": torch.__version__}
    if not args.dry_run:
        saved["launch_timeline"] = launch_timeline(device, graphs)
    saved["batch1_tpot"] = batch1_tpot(tpot_shape, device, dtype, graphs, new_tokens)
    saved["throughput"] = throughput(load_shape, device, dtype, graphs, n, low, high)
    if not args.dry_run:
        (RESULTS / "gpu_graphs.json").write_text(json.dumps(saved, indent=2) + "\n")
        print(f"wrote {RESULTS / 'gpu_graphs.json'}")


if __name__ == "__main__":
    main()
