#!/usr/bin/env bash
# GPU checks for the paged KV cache (chapter 4), the prefix cache (chapter 5), chunked prefill (chapter 6),
# speculative decoding (chapter 7), CUDA Graphs (chapter 8), serving (chapter 9), tensor parallelism over NCCL and
# disaggregated prefill/decode (chapter 13, section 6: TP=2 when the machine has two GPUs) and quantized weights (chapter 12,
# the Triton int8/int4 matmul and the paged kernels on int8/fp8 caches, compiled for CUDA: tests/test_quantization.py,
# tests/test_quantized_kv.py), as one script for a machine
# with an NVIDIA GPU.
#
# What it measures:
#   1. the Triton kernels (minillm/attention/triton_paged.py) against the torch reference, now
#      compiled for CUDA instead of interpreted (tests/test_triton_paged.py, incl. float16), and
#      the paged attention / engine tests; the engine with Triton kernels on CUDA reproduces the
#      naive loop with block sizes 8/16/32, with and without preemption, and with the prefix cache
#      (shared, fully cached and evicted prefixes; tests/test_cuda_engine.py, tests/test_prefix_cache*.py),
#      and with chunked prefill through the Triton prefill/extend kernel (chunks of 1-64, the prefix cache,
#      preemption; the kernel itself in float32/float16/bfloat16: tests/test_triton_paged.py -k prefill);
#      Speculative decoding on CUDA (the shipped target and draft, float32, Triton paged, preemption) reproduces
#      the naive loop, and the speculative tests run on CUDA (tests/test_speculative_*.py);
#      CUDA Graphs (chapter 8): one graph per bucket reproduces the naive loop across bucket edges, preemption and
#      an abort, with the torch attention and the Triton kernels, and a replay allocates nothing
#      (tests/test_cuda_engine.py; the bucket / padding / buffer logic in tests/test_static_decode.py);
#   2. benchmarks/paged_decode.py: decode attention time, Triton vs torch reference, for batches
#      of 1-128 sequences and contexts of 512 and 4096 tokens (Llama-8B-like heads, bfloat16),
#      and the engine's output tok/s contiguous vs paged (torch) vs paged (Triton).
# Usage: bash scripts/gpu_check.sh          (from the repository root; needs torch with CUDA + triton)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
$PY - <<'PY'
import torch, triton
assert torch.cuda.is_available(), "no CUDA GPU visible"
print("torch", torch.__version__, "triton", triton.__version__, "GPU", torch.cuda.get_device_name())
PY
unset TRITON_INTERPRET
$PY -m pytest -q tests/test_triton_paged.py tests/test_paged_attention.py tests/test_cuda_engine.py tests/test_paged_engine.py \
    tests/test_prefix_cache.py tests/test_prefix_cache_engine.py tests/test_chunked_prefill.py \
    tests/test_speculative_acceptance.py tests/test_speculative_engine.py tests/test_static_decode.py \
    tests/test_quantization.py tests/test_quantized_kv.py
$PY benchmarks/paged_decode.py
# 3. speculative decoding's batch-1 figures on the GPU (bfloat16, the shipped models): output tok/s without and with
#    speculation, tokens per target pass, and how many outputs equal the run without it (bfloat16 may flip a tie)
$PY - <<'PY'
import time
import minillm
from minillm import EngineConfig, SamplingParams, SpeculativeConfig
from minillm.engine import LLMEngine
model, tokenizer = minillm.load_model(device="cuda", dtype="bfloat16"), minillm.load_tokenizer()
text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
prompts = [text[97 * i : 97 * i + 48] for i in range(6)]
params = SamplingParams(temperature=0, max_new_tokens=128, ignore_eos=True)
def run(spec):
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=1, max_model_len=512, speculative=spec))
    engine.add_request(prompts[0][:8], SamplingParams(temperature=0, max_new_tokens=8))  # warm-up
    while engine.has_unfinished():
        engine.step()
    start = time.perf_counter()
    ids = [engine.add_request(p, params).request_id for p in prompts]
    while engine.has_unfinished():
        engine.step()
    outs = [engine.output(i).token_ids for i in ids]
    return outs, sum(map(len, outs)) / (time.perf_counter() - start), engine.speculative_metrics
plain, plain_speed, _ = run(None)
for spec in [SpeculativeConfig("draft", k) for k in (2, 4, 6)] + [SpeculativeConfig("ngram", 4)]:
    outs, speed, m = run(spec)
    print(f"batch 1, {spec.method} k={spec.num_speculative_tokens}: {plain_speed:.0f} -> {speed:.0f} tok/s "
          f"({speed / plain_speed:.2f}x), {m['tokens_per_pass']:.2f} tokens per pass, "
          f"{sum(a == b for a, b in zip(outs, plain))}/{len(plain)} outputs equal")
PY
# 4. CUDA Graphs (chapter 8): the launch timeline of one batch-1 step, eager against a graph replay (written to
#    benchmarks/results/launch_timeline_cuda.json, which chapter 8 draws); batch-1 TPOT of a Qwen2.5-0.5B-shaped
#    random bfloat16 model, eager against graphs; 256 requests with prompt and output lengths uniform in
#    [100, 1024] on a Qwen3-0.6B-shaped random bfloat16 model with graphs: output tok/s and the share of the
#    memory roofline its decode steps reach (benchmarks/results/gpu_graphs.json); then the decode step against
#    batch size, eager vs compiled vs CUDA Graphs, on the shipped target in bfloat16
$PY benchmarks/gpu_graphs.py
$PY benchmarks/decode_overhead.py --dtypes bfloat16 --batches 1 8 64 --repeats 2
# 5. Serving (chapter 9): the same load as benchmarks/serve_load.py against `python -m minillm serve` on CUDA
#    (the shipped target, bfloat16, CUDA Graphs), at three rates; results in benchmarks/results/serve_load_cuda.json
$PY -m minillm serve --port 8765 --dtype bfloat16 --cuda-graphs --max-num-seqs 64 --max-model-len 1024 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
$PY -m minillm bench --url http://127.0.0.1:8765/v1 --rate 16 64 256 --num-prompts 500 --max-tokens 64 --ignore-eos \
    --out benchmarks/results/serve_load_cuda
kill $SERVER
# 6. Tensor parallelism (chapter 13) with NCCL: TP=2 on two GPUs gives the TP=1 engine's greedy tokens (the shipped
#    target, float32), with the decode step's time and rank 0's time in all-reduces; then the disaggregated pair (prefill and decode cores on GPU 0, K/V over NCCL) against one engine.
if [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  $PY - <<'PY'
import statistics, minillm
from minillm import EngineConfig, SamplingParams
from minillm.engine import LLMEngine
model, tokenizer = minillm.load_model(device="cuda"), minillm.load_tokenizer()
text = tokenizer.encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
prompts = [text[97 * i : 97 * i + 64] for i in range(8)]
params = SamplingParams(temperature=0, max_new_tokens=64, ignore_eos=True)
def run(size):
    engine = LLMEngine(model, tokenizer, EngineConfig(tensor_parallel_size=size, kv="paged", max_num_seqs=8))
    try:
        ids = [engine.add_request(p, params).request_id for p in prompts]
        while engine.has_unfinished():
            engine.step()
        steps = [s.duration for s in engine.trace.steps][2:]
        comm = engine.workers.communicator.totals["all-reduce"].seconds if engine.workers else 0.0
        return [engine.output(i).token_ids for i in ids], statistics.median(steps), comm / len(engine.trace.steps)
    finally:
        engine.close()
one, step1, _ = run(1)
two, step2, comm2 = run(2)
print(f"NCCL TP=2: {sum(a == b for a, b in zip(one, two))}/{len(one)} outputs equal TP=1's; decode step "
      f"{step1 * 1e3:.2f} -> {step2 * 1e3:.2f} ms, all-reduce (launch time, not synchronized) {comm2 * 1e3:.2f} ms")
assert one == two, "TP=2 on NCCL changed the greedy tokens"
PY
else
  echo "one GPU: tensor parallelism over NCCL needs two (the CPU tests ran TP=2 and 4 with gloo)"
fi
$PY benchmarks/disaggregation.py --out benchmarks/results/disaggregation_cuda --repeats 2 || true
