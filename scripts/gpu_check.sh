#!/usr/bin/env bash
# GPU checks for the paged KV cache (chapter 4), the prefix cache (chapter 5) and chunked prefill (chapter 6),
# as one script for a machine with an NVIDIA GPU.
#
# What it measures:
#   1. the Triton kernels (minillm/attention/triton_paged.py) against the torch reference, now
#      compiled for CUDA instead of interpreted (tests/test_triton_paged.py, incl. float16), and
#      the paged attention / engine tests; the engine with Triton kernels on CUDA reproduces the
#      naive loop with block sizes 8/16/32, with and without preemption, and with the prefix cache
#      (shared, fully cached and evicted prefixes; tests/test_cuda_engine.py, tests/test_prefix_cache*.py),
#      and with chunked prefill through the Triton prefill/extend kernel (chunks of 1-64, the prefix cache,
#      preemption; the kernel itself in float32/float16/bfloat16: tests/test_triton_paged.py -k prefill);
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
    tests/test_prefix_cache.py tests/test_prefix_cache_engine.py tests/test_chunked_prefill.py
$PY benchmarks/paged_decode.py
