"""The Triton paged-attention kernels against the torch reference in `minillm/attention/paged_ops.py`.

Without CUDA the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`) on CPU tensors: slow, but
it executes the same kernel code, masks and pointer arithmetic included. With CUDA they are compiled
and run on the GPU, where float16 and bfloat16 are checked too.

The decode tests give the kernel a *poisoned* copy of the cache: every slot that no sequence may see
(unused blocks, the tail of each last block, the blocks that the padding of a block table points to)
is NaN. A kernel that reads one past a sequence's end, or lets a masked slot into its sums, returns NaN.
The reference gets the clean cache, since it gathers whole blocks and masks the scores afterwards.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from minillm.attention import paged_ops

# Triton chooses between compiling and interpreting when a function is *decorated*, its own library
# included (tl.zeros, tl.sum, ... are decorated when `import triton` runs). So TRITON_INTERPRET must be set
# before triton is first imported in the process: tests/conftest.py sets it, before any test module loads.
INTERPRET = not torch.cuda.is_available()

triton = pytest.importorskip("triton")

DEVICE = "cpu" if INTERPRET else "cuda"
KERNEL_MODULE = "minillm.attention.triton_paged"
needs_cuda = pytest.mark.skipif(INTERPRET, reason="float16/bfloat16 run on CUDA only")


def _is_interpreted(function) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(function, InterpretedFunction)


def _interpreter_cannot_loop_on_this_numpy() -> bool:
    """Triton < 3.7's interpreter turns a loop bound into an int with int(array of shape (1,)), which
    numpy >= 2.4 refuses."""
    major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    try:
        int(np.ones(1))
    except TypeError:
        return (major, minor) < (3, 7)
    return False


@pytest.fixture(scope="module")
def kernels():
    """minillm.attention.triton_paged, its kernels interpreted when there is no GPU."""
    if INTERPRET:
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("no CUDA and TRITON_INTERPRET is set to something other than 1: the kernels cannot run")
        if _interpreter_cannot_loop_on_this_numpy():
            pytest.skip(f"the interpreter of triton {triton.__version__} fails on `range(tensor)` with numpy "
                        f"{np.__version__}: install triton >= 3.7")
        if not _is_interpreted(importlib.import_module("triton.language").zeros):
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it first)")
    module = importlib.import_module(KERNEL_MODULE)
    if INTERPRET:
        assert _is_interpreted(module._paged_decode_attention_kernel)
        assert _is_interpreted(module._store_kv_kernel)
        assert _is_interpreted(module._paged_prefill_attention_kernel)
    return module


# ---------------------------------------------------------------------------------------------------- helpers


def paged_batch(context_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int,
                gen: torch.Generator, dtype: torch.dtype = torch.float32, index_dtype: torch.dtype = torch.int32):
    """A paged cache holding len(context_lens) sequences in shuffled, non-contiguous physical blocks.

    Returns (k_cache, v_cache, block_tables) for the reference (random everywhere; table padding = block 0)
    and (k_poisoned, v_poisoned, poisoned_tables) for the kernel: the same visible tokens, NaN everywhere
    else, table padding pointing at a spare, all-NaN block.
    """
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few spare blocks that no sequence owns
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    spare_block = physical.pop()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    k_poisoned = torch.full_like(k_cache, float("nan"))
    v_poisoned = torch.full_like(v_cache, float("nan"))

    max_blocks = max(blocks_per_seq) + 1  # every row has padding
    block_tables = torch.zeros(len(context_lens), max_blocks, dtype=index_dtype)
    poisoned_tables = torch.full_like(block_tables, spare_block)
    for seq, (length, count) in enumerate(zip(context_lens, blocks_per_seq)):
        blocks = [physical.pop() for _ in range(count)]
        block_tables[seq, :count] = poisoned_tables[seq, :count] = torch.tensor(blocks, dtype=index_dtype)
        for position in range(length):
            block, offset = blocks[position // block_size], position % block_size
            k_poisoned[block, offset] = k_cache[block, offset]
            v_poisoned[block, offset] = v_cache[block, offset]
    lens = torch.tensor(context_lens, dtype=index_dtype, device=DEVICE)
    clean = (k_cache.to(DEVICE), v_cache.to(DEVICE), block_tables.to(DEVICE))
    poisoned = (k_poisoned.to(DEVICE), v_poisoned.to(DEVICE), poisoned_tables.to(DEVICE))
    return clean, poisoned, lens


def check_decode(kernels, context_lens: list[int], block_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, seed: int, dtype: torch.dtype = torch.float32, index_dtype: torch.dtype = torch.int32,
                 atol: float = 1e-5, rtol: float = 1e-5) -> None:
    gen = torch.Generator().manual_seed(seed)
    clean, poisoned, lens = paged_batch(context_lens, block_size, num_kv_heads, head_dim, gen, dtype, index_dtype)
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen).to(dtype=dtype, device=DEVICE)
    scale = head_dim**-0.5

    out = kernels.paged_decode_attention(q, *poisoned, lens, scale)
    # the reference in float32, so that low-precision runs are compared with the exact answer
    expected = paged_ops.paged_decode_attention(q.float(), clean[0].float(), clean[1].float(), clean[2], lens, scale)
    assert out.shape == (len(context_lens), num_heads, head_dim) and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------------- store_kv


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused-views"])
@pytest.mark.parametrize("num_kv_heads, head_dim", [(2, 64), (3, 48)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_store_kv_matches_reference(kernels, block_size, num_kv_heads, head_dim, fused, slot_dtype):
    gen = torch.Generator().manual_seed(block_size * 100 + num_kv_heads * 10 + fused)
    num_blocks, num_tokens = 5, 11
    if fused:  # K and V as strided views of one (num_tokens, 2, num_kv_heads, head_dim) tensor
        k, v = torch.randn(num_tokens, 2, num_kv_heads, head_dim, generator=gen).unbind(1)
    else:
        k, v = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(slot_dtype)
    k_cache, v_cache = (torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    k, v, slots, k_cache, v_cache = (t.to(DEVICE) for t in (k, v, slots, k_cache, v_cache))
    k_expected, v_expected = k_cache.clone(), v_cache.clone()

    kernels.store_kv(k, v, k_cache, v_cache, slots)
    paged_ops.store_kv(k, v, k_expected, v_expected, slots.long())
    # exact: the written slots hold k and v (the caches held other random values before), and the others
    # are untouched
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)


def test_store_kv_with_no_tokens_is_a_no_op(kernels):
    k_cache = torch.randn(2, 8, 2, 16, device=DEVICE)
    before = k_cache.clone()
    empty = torch.empty(0, 2, 16, device=DEVICE)
    kernels.store_kv(empty, empty, k_cache, k_cache, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(k_cache, before)


# ---------------------------------------------------------------------------------------------------- decode


@pytest.mark.parametrize("head_dim", [64, 48])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 2), (6, 1)], ids=["mha", "gqa-2", "gqa-6"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_decode_matches_reference(kernels, block_size, num_heads, num_kv_heads, head_dim):
    # ragged, in no particular order: one past a boundary, a single token, just short of three blocks,
    # exactly one and two blocks, and one random length
    gen = torch.Generator().manual_seed(block_size + head_dim)
    random_len = int(torch.randint(2, 3 * block_size, (1,), generator=gen))
    context_lens = [block_size + 1, 1, 3 * block_size - 1, block_size, 2 * block_size, random_len]
    check_decode(kernels, context_lens, block_size, num_heads, num_kv_heads, head_dim, seed=num_heads + head_dim)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_decode_accepts_int32_and_int64_indices(kernels, index_dtype):
    check_decode(kernels, [9, 16, 3], block_size=8, num_heads=4, num_kv_heads=2, head_dim=32, seed=1,
                 index_dtype=index_dtype)


def test_decode_with_one_token_per_sequence_and_head_dim_80(kernels):
    # softmax over a single score is 1: the output is that token's V, whatever q is
    check_decode(kernels, [1, 1, 1], block_size=16, num_heads=4, num_kv_heads=4, head_dim=80, seed=2)


@pytest.mark.parametrize("scores", ["rising", "falling"])
def test_decode_online_softmax_with_large_scores(kernels, scores):
    """Scores from -5 to 150 (exp(150) overflows float32), in 5 blocks. Rising, every block raises the
    running max, so a missing or wrong rescale shows; falling, the first block holds the max, so a kernel
    that let the running max drop would overflow on rescaling by exp(150 - ...)."""
    block_size, head_dim, length = 8, 16, 40
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, head_dim, generator=gen)
    q = q / q.norm()
    ramp = torch.linspace(-5.0, 150.0, length)  # the score of each token: q . k = ramp, scale 1
    ramp = (ramp if scores == "rising" else ramp.flip(0))[:, None, None]  # (length, 1, 1)
    keys = ramp * q + 0.01 * torch.randn(length, 1, head_dim, generator=gen)
    values = torch.randn(length, 1, head_dim, generator=gen)
    physical = torch.randperm(length // block_size, generator=gen)
    k_cache = torch.empty(length // block_size, block_size, 1, head_dim)
    v_cache = torch.empty_like(k_cache)
    k_cache[physical] = keys.view(-1, block_size, 1, head_dim)
    v_cache[physical] = values.view(-1, block_size, 1, head_dim)
    args = (q, k_cache, v_cache, physical[None].to(torch.int32), torch.tensor([length], dtype=torch.int32), 1.0)
    args = tuple(t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in args)

    out = kernels.paged_decode_attention(*args)
    expected = paged_ops.paged_decode_attention(*args)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_decode_reads_a_strided_query(kernels):
    """q as a view: the query part of a fused (num_seqs, heads + 2 * kv_heads, head_dim) projection."""
    gen = torch.Generator().manual_seed(4)
    clean, poisoned, lens = paged_batch([5, 20], block_size=8, num_kv_heads=2, head_dim=32, gen=gen)
    qkv = torch.randn(2, 4 + 2 * 2, 32, generator=gen).to(DEVICE)
    q = qkv[:, :4]
    assert not q.is_contiguous()
    out = kernels.paged_decode_attention(q, *poisoned, lens, 0.2)
    expected = paged_ops.paged_decode_attention(q.contiguous(), *clean, lens, 0.2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------- prefill / extend


SENTINEL = 7.0  # rows of `out` that no sequence owns must keep it


def check_prefill(kernels, chunks: list[tuple[int, int]], block_size: int, num_heads: int, num_kv_heads: int,
                  head_dim: int, seed: int, dtype: torch.dtype = torch.float32, atol: float = 1e-5,
                  rtol: float = 1e-5) -> None:
    """`chunks`: (tokens cached before the chunk, chunk length) per sequence. The flat batch puts one
    foreign row (a decode's, say) before every chunk: the kernel must write exactly its sequences' rows."""
    gen = torch.Generator().manual_seed(seed)
    clean, poisoned, _ = paged_batch([start + n for start, n in chunks], block_size, num_kv_heads, head_dim, gen,
                                     dtype)
    rows, row = [], 0
    for _, n in chunks:
        rows.append(row + 1)  # one foreign row first
        row += 1 + n
    q = torch.randn(row, num_heads, head_dim, generator=gen).to(dtype=dtype, device=DEVICE)
    index = {"device": DEVICE, "dtype": torch.int32}
    starts = torch.tensor(rows, **index)
    lens = torch.tensor([n for _, n in chunks], **index)
    context = torch.tensor([start for start, _ in chunks], **index)
    scale = head_dim**-0.5

    out = torch.full_like(q, SENTINEL)
    kernels.paged_prefill_attention(q, *poisoned, starts, lens, context, scale, out, max(n for _, n in chunks))
    expected = torch.full_like(q, SENTINEL, dtype=torch.float32)
    paged_ops.paged_prefill_attention(q.float(), clean[0].float(), clean[1].float(), clean[2], starts, lens, context,
                                      scale, expected)
    assert out.dtype == dtype
    foreign = [r - 1 for r in rows]
    assert (out[foreign] == SENTINEL).all(), "the kernel wrote rows that belong to no sequence"
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol)


def test_the_prefill_reference_is_causal_attention_written_out():
    """The torch reference itself against softmax(q k^T) v written out token by token, keys from a plain list."""
    gen = torch.Generator().manual_seed(11)
    block_size, heads, kv_heads, head_dim, start, n = 4, 4, 2, 8, 6, 5
    keys, values = torch.randn(start + n, kv_heads, head_dim, generator=gen), torch.randn(start + n, kv_heads, head_dim,
                                                                                          generator=gen)
    table = [2, 0, 3]  # physical blocks of the 11 tokens
    k_cache, v_cache = torch.zeros(4, block_size, kv_heads, head_dim), torch.zeros(4, block_size, kv_heads, head_dim)
    for t in range(start + n):
        k_cache[table[t // block_size], t % block_size] = keys[t]
        v_cache[table[t // block_size], t % block_size] = values[t]
    q = torch.randn(n, heads, head_dim, generator=gen)
    out = torch.zeros_like(q)
    as_tensor = lambda *xs: torch.tensor(xs)  # noqa: E731
    paged_ops.paged_prefill_attention(q, k_cache, v_cache, torch.tensor([table]), as_tensor(0), as_tensor(n),
                                      as_tensor(start), 0.5, out)
    for j in range(n):
        for h in range(heads):
            kv = h // (heads // kv_heads)
            weights = torch.softmax(0.5 * keys[: start + j + 1, kv] @ q[j, h], dim=0)  # keys 0 .. start + j
            torch.testing.assert_close(out[j, h], weights @ values[: start + j + 1, kv], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [64, 48])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 2), (6, 1)], ids=["mha", "gqa-2", "gqa-6"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_prefill_matches_reference(kernels, block_size, num_heads, num_kv_heads, head_dim):
    # ragged, in no particular order: a whole prompt longer than one query tile; a chunk starting mid-block
    # and crossing a boundary; a chunk starting on a boundary; a chunk of one token; a random one
    gen = torch.Generator().manual_seed(block_size + head_dim)
    random_start, random_len = (int(x) for x in torch.randint(1, 3 * block_size, (2,), generator=gen))
    chunks = [(0, 2 * block_size + 3), (block_size - 3, 7), (2 * block_size, block_size), (5, 1),
              (random_start, random_len)]
    check_prefill(kernels, chunks, block_size, num_heads, num_kv_heads, head_dim, seed=num_heads + head_dim)


def test_prefill_with_a_chunk_longer_than_two_query_tiles_and_head_dim_80(kernels):
    check_prefill(kernels, [(3, 40), (0, 17)], block_size=16, num_heads=4, num_kv_heads=4, head_dim=80, seed=12)


def test_prefill_reads_a_strided_query_and_int64_indices(kernels):
    gen = torch.Generator().manual_seed(13)
    clean, poisoned, _ = paged_batch([12], block_size=8, num_kv_heads=2, head_dim=32, gen=gen)
    qkv = torch.randn(5, 4 + 2 * 2, 32, generator=gen).to(DEVICE)
    q = qkv[:, :4]
    assert not q.is_contiguous()
    index = {"device": DEVICE, "dtype": torch.int64}
    args = (torch.tensor([0], **index), torch.tensor([5], **index), torch.tensor([7], **index), 0.2)
    out, expected = torch.zeros(5, 4, 32, device=DEVICE), torch.zeros(5, 4, 32, device=DEVICE)
    kernels.paged_prefill_attention(q, *poisoned[:2], poisoned[2].long(), *args, out)
    paged_ops.paged_prefill_attention(q.contiguous(), *clean, *args, expected)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_prefill_rejects_bad_shapes(kernels):
    k_cache = torch.zeros(4, 8, 2, 16, device=DEVICE)
    tables = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    one = torch.ones(1, dtype=torch.int32, device=DEVICE)
    q = torch.zeros(3, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="out must"):
        kernels.paged_prefill_attention(q, k_cache, k_cache, tables, one, one, one, 1.0, q[:2])
    with pytest.raises(ValueError, match="query_lens"):
        kernels.paged_prefill_attention(q, k_cache, k_cache, tables, one, one.repeat(2), one, 1.0, q.clone())
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        q3 = torch.zeros(3, 3, 16, device=DEVICE)
        kernels.paged_prefill_attention(q3, k_cache, k_cache, tables, one, one, one, 1.0, q3.clone())


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's own bfloat16 path")
def test_prefill_bfloat16_in_the_interpreter(kernels):
    """Triton's interpreter computes bfloat16 tl.dot wrongly (triton-lang/triton#11584); the wrapper
    upcasts there, so bfloat16 runs on a CPU give bfloat16-accurate attention, not garbage."""
    tol = 1.6e-2
    check_prefill(kernels, [(0, 21), (13, 9), (7, 1)], block_size=8, num_heads=4, num_kv_heads=2, head_dim=48,
                  seed=3, dtype=torch.bfloat16, atol=tol, rtol=tol)


# ---------------------------------------------------------------------------------------------------- CUDA only

LOW_PRECISION = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # a few ulps of the output's dtype


@needs_cuda
@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=str)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_decode_low_precision_on_cuda(kernels, block_size, dtype):
    tol = LOW_PRECISION[dtype]
    check_decode(kernels, [block_size + 1, 1, 3 * block_size - 1, block_size, 37], block_size, 6, 2, 80,
                 seed=block_size, dtype=dtype, atol=tol, rtol=tol)


@needs_cuda
@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=str)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_prefill_low_precision_on_cuda(kernels, block_size, dtype):
    tol = LOW_PRECISION[dtype]
    check_prefill(kernels, [(0, 3 * block_size + 5), (block_size - 2, 9), (7, 1), (40, 70)], block_size, 6, 2, 80,
                  seed=block_size, dtype=dtype, atol=tol, rtol=tol)


@needs_cuda
@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=str)
def test_store_kv_low_precision_on_cuda(kernels, dtype):
    gen = torch.Generator().manual_seed(5)
    k, v = (torch.randn(7, 2, 48, generator=gen).to(dtype=dtype, device=DEVICE) for _ in range(2))
    k_cache, v_cache = (torch.randn(4, 16, 2, 48, generator=gen).to(dtype=dtype, device=DEVICE) for _ in range(2))
    slots = torch.randperm(64, generator=gen)[:7].to(DEVICE)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    kernels.store_kv(k, v, k_cache, v_cache, slots)
    paged_ops.store_kv(k, v, k_expected, v_expected, slots)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


# ---------------------------------------------------------------------------------------------------- compiling


# Run in a fresh process: compiling needs triton imported *without* TRITON_INTERPRET (in interpreter mode
# triton's own library functions are interpreted ones, which the compiler cannot use).
COMPILE_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minillm.attention import triton_paged as kernels


def compile_kernel(fn, types, constants):
    signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in fn.arg_names}
    return triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32))


# the model's dtype, the index dtype, what the cache holds (chapter 12's codes: KV_CODES 1 int8 + scales, 2 fp8)
for dtype, index, cache, codes in [("fp32", "i32", "fp32", 0), ("fp16", "i32", "fp16", 0), ("bf16", "i64", "bf16", 0),
                                   ("bf16", "i32", "i8", 1), ("fp16", "i64", "u8", 2)]:
    data = {name: "*" + dtype for name in ("out_ptr", "q_ptr", "k_ptr", "v_ptr")}
    scales = "*fp16" if codes == 1 else "*" + cache
    data |= {"k_cache_ptr": "*" + cache, "v_cache_ptr": "*" + cache, "k_scale_ptr": scales, "v_scale_ptr": scales}
    decode = compile_kernel(kernels._paged_decode_attention_kernel,
                            {**data, "block_tables_ptr": "*" + index, "context_lens_ptr": "*" + index, "scale": "fp32"},
                            {"BLOCK_SIZE": 16, "HEAD_DIM_PADDED": 128, "KV_CODES": codes})
    store = compile_kernel(kernels._store_kv_kernel, {**data, "k_ptr": "*" + cache, "v_ptr": "*" + cache,
                                                      "slot_mapping_ptr": "*" + index},
                           {"BLOCK_SIZE": 16, "HEADS_PADDED": 4, "HEAD_DIM_PADDED": 128})
    prefill = compile_kernel(kernels._paged_prefill_attention_kernel,
                             {**data, "block_tables_ptr": "*" + index, "query_starts_ptr": "*" + index,
                              "query_lens_ptr": "*" + index, "context_starts_ptr": "*" + index, "scale": "fp32"},
                             {"BLOCK_SIZE": 16, "BLOCK_M": 16, "BLOCK_N": 32, "HEAD_DIM_PADDED": 128,
                              "PRECISION": "ieee" if dtype == "fp32" else "tf32", "UPCAST": False, "KV_CODES": codes})
    assert decode.asm["cubin"] and store.asm["cubin"] and prefill.asm["cubin"]
    print(dtype, index, cache, "compiled")
"""


def test_kernels_compile_for_a_gpu_target(tmp_path):
    """Compile the three kernels down to a cubin for sm_90, in float32, float16 and bfloat16, and on int8 and fp8
    caches (chapter 12; no GPU needed):
    catches what the interpreter lets through, like a loop-carried variable that changes type."""
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("this triton build has no NVIDIA backend")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a real compile, not a cache hit
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout.split("\n")[:5] == ["fp32 i32 fp32 compiled", "fp16 i32 fp16 compiled",
                                              "bf16 i64 bf16 compiled", "bf16 i32 i8 compiled", "fp16 i64 u8 compiled"]


# ---------------------------------------------------------------------------------------------------- errors


def test_decode_rejects_bad_shapes(kernels):
    k_cache = torch.zeros(4, 8, 2, 16, device=DEVICE)
    tables = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        kernels.paged_decode_attention(torch.zeros(2, 3, 16, device=DEVICE), k_cache, k_cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        kernels.paged_decode_attention(torch.zeros(2, 4, 32, device=DEVICE), k_cache, k_cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="power of two"):
        odd_cache = torch.zeros(4, 6, 2, 16, device=DEVICE)
        kernels.paged_decode_attention(torch.zeros(2, 4, 16, device=DEVICE), odd_cache, odd_cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="context_lens"):
        kernels.paged_decode_attention(torch.zeros(2, 4, 16, device=DEVICE), k_cache, k_cache, tables, lens[:1], 1.0)


def test_store_kv_rejects_bad_shapes(kernels):
    k_cache = torch.zeros(4, 8, 2, 16, device=DEVICE)
    k = torch.zeros(3, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.store_kv(k, k, k_cache, k_cache, torch.zeros(2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="k and v"):
        kernels.store_kv(k[:, :1], k[:, :1], k_cache, k_cache, torch.zeros(3, dtype=torch.int64, device=DEVICE))


def test_module_imports_without_triton_and_says_so_when_called(monkeypatch):
    """A private copy of the module, loaded while `import triton` fails (as on a torch build without it)."""
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.find_spec(KERNEL_MODULE)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)

    assert copy.TRITON_AVAILABLE is False
    x = torch.zeros(1, 1, 4)
    cache = torch.zeros(1, 4, 1, 4)
    with pytest.raises(RuntimeError, match="triton"):
        copy.store_kv(x, x, cache, cache, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="triton"):
        copy.paged_decode_attention(x, cache, cache, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1), 1.0)
