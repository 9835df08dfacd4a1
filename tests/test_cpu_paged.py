"""The C decode kernel (minillm/attention/cpu_paged.py) equals the torch reference, refuses what it
cannot read safely, compiles into a torch.compile'd step, and the engine with it or without it gives
the naive loop's tokens."""

import pytest
import torch

from minillm.attention import cpu_paged, paged_ops
from minillm.attention.paged import PagedKVCache
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.memory import zeros_on_huge_pages
from tests.hf_reference import ByteTokenizer
from tests.test_engine import _reference, run_to_completion

pytestmark = pytest.mark.skipif(cpu_paged.unavailable_reason() is not None,
                                reason=f"C kernel unavailable: {cpu_paged.unavailable_reason()}")


def case(lengths, block_size, heads, kv_heads, head_dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in lengths)
    num_blocks = width * len(lengths) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen)[: width * len(lengths)].view(len(lengths), width)
    q = torch.randn(len(lengths), heads, head_dim, generator=gen)
    return q, k_cache, v_cache, tables.to(torch.int32), torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("block_size", [1, 5, 16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (6, 1, 48), (2, 2, 8), (8, 8, 96)])
def test_kernel_equals_the_torch_reference(block_size, heads, kv_heads, head_dim):
    # contexts of one token, on a block boundary, just past it, and long beside short
    lengths = [1, block_size, block_size + 1, 3 * block_size + 2, 70]
    q, k_cache, v_cache, tables, lens = case(lengths, block_size, heads, kv_heads, head_dim)
    expected = paged_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.37)
    got = cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.37)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("num_seqs", [1, 2, 9])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (14, 2, 64), (8, 2, 128), (16, 4, 64)])
def test_kernel_groups_kv_heads_per_task_as_the_batch_allows(num_seqs, heads, kv_heads, head_dim):
    """One sequence gives each KV head its own task (every thread busy); many give a task all the KV
    heads whose query heads fit in registers; the shapes compiled with constant sizes and the rest alike."""
    lengths = [1 + (37 * i) % 90 for i in range(num_seqs)]
    q, k_cache, v_cache, tables, lens = case(lengths, 16, heads, kv_heads, head_dim, seed=num_seqs)
    # consecutive blocks for some rows, scattered for the others: the prefetch at a jump, and the runs
    tables[::2] = torch.arange(tables[::2].numel(), dtype=torch.int32).view(-1, tables.shape[1])
    expected = paged_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    got = cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_kernel_softmax_holds_at_extreme_scores():
    """Scores hundreds apart (one token takes it all, the rest underflow to 0) and scores all equal:
    the kernel's polynomial exp must agree with torch's where it matters."""
    q, k_cache, v_cache, tables, lens = case([40, 300, 17], 16, 4, 2, 64, seed=3)
    for scale in (40.0, 0.0, 1e-4):
        expected = paged_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
        got = cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_kernel_exp_is_float_exact_over_the_softmax_range():
    """fast_exp (minillm/csrc/fast_exp.h, the C kernels' e^x) against torch.exp over [-87, 0]: at most a
    few units in the last place (the attention rows above rely on it being this close)."""
    x = torch.cat([torch.linspace(-87.0, 0.0, 100_001), torch.tensor([-1e-30, -0.0, -86.99])])
    # one query over two tokens with scores 0 and x: the weight of the second is e^x / (1 + e^x)
    k_cache = torch.zeros(len(x), 2, 1, 1)
    k_cache[:, 1, 0, 0] = 1.0
    v_cache = torch.zeros(len(x), 2, 1, 1)
    v_cache[:, 1, 0, 0] = 1.0
    tables = torch.arange(len(x), dtype=torch.int32).view(-1, 1)
    lens = torch.full((len(x),), 2, dtype=torch.int32)
    got = torch.cat([cpu_paged.paged_decode_attention(torch.ones(1, 1, 1), k_cache[i : i + 1], v_cache[i : i + 1],
                                                      tables[:1] * 0, lens[:1], float(x[i]))
                     for i in range(0, len(x), 997)]).flatten()
    want = (torch.exp(x[::997].double()) / (1 + torch.exp(x[::997].double()))).float()
    torch.testing.assert_close(got, want, atol=1e-37, rtol=6e-7)


def prefill_case(starts, lens, block_size, heads, kv_heads, head_dim, seed=0):
    """q as the view of a fused qkv projection (tokens a row apart), every sequence's blocks scattered."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-(s + n) // block_size) for s, n in zip(starts, lens))
    num_blocks = width * len(lens) + 2
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen)[: width * len(lens)].view(len(lens), width).to(torch.int32)
    qkv = torch.randn(sum(lens) + 3, (heads + 2 * kv_heads) * head_dim, generator=gen)  # + 3 rows no sequence owns
    q = qkv[:, : heads * head_dim].view(-1, heads, head_dim)
    rows = torch.tensor([3 + sum(lens[:i]) for i in range(len(lens))], dtype=torch.int32)
    as_int = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    return q, k_cache, v_cache, tables, rows, as_int(lens), as_int(starts)


@pytest.mark.parametrize("starts,lens", [([0], [1]), ([0, 0], [264, 77]), ([0, 40, 5], [1, 33, 130]),
                                         ([16, 0, 31], [16, 17, 2])])
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(4, 2, 64, 16), (14, 2, 64, 16), (8, 8, 32, 5),
                                                                 (8, 2, 128, 16), (6, 1, 48, 4)])
def test_prefill_kernel_equals_the_torch_reference(starts, lens, heads, kv_heads, head_dim, block_size):
    """Fresh prefills and extends after cached tokens (on a block boundary and not), one token or hundreds,
    the shapes compiled with constant sizes and the rest; the rows of no sequence are left as they were."""
    q, k_cache, v_cache, tables, rows, query_lens, context_starts = prefill_case(starts, lens, block_size, heads,
                                                                                 kv_heads, head_dim)
    expected = torch.full(q.shape, 7.0)
    paged_ops.paged_prefill_attention(q, k_cache, v_cache, tables, rows, query_lens, context_starts, 0.125, expected)
    got = torch.full(q.shape, 7.0)
    cpu_paged.paged_prefill_attention(q, k_cache, v_cache, tables, rows, query_lens, context_starts, 0.125, got)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    assert (got[:3] == 7.0).all()


def test_prefill_kernel_reads_nothing_past_a_context():
    """Every place of the cache no sequence's context covers holds NaN: a stray read would show."""
    q, k_cache, v_cache, tables, rows, query_lens, context_starts = prefill_case([5, 0], [20, 33], 16, 4, 2, 64, 4)
    used = {}
    for table, start, n in zip(tables.tolist(), context_starts.tolist(), query_lens.tolist()):
        for position in range(start + n):
            used.setdefault(table[position // 16], set()).add(position % 16)
    for cache in (k_cache, v_cache):
        for block in range(cache.shape[0]):
            for slot in range(16):
                if slot not in used.get(block, ()):
                    cache[block, slot] = float("nan")
    expected, got = torch.zeros(q.shape), torch.zeros(q.shape)
    paged_ops.paged_prefill_attention(q, k_cache, v_cache, tables, rows, query_lens, context_starts, 0.125, expected)
    cpu_paged.paged_prefill_attention(q, k_cache, v_cache, tables, rows, query_lens, context_starts, 0.125, got)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_prefill_kernel_refuses_what_it_cannot_read_safely():
    q, k_cache, v_cache, tables, rows, query_lens, context_starts = prefill_case([0, 4], [5, 3], 4, 4, 2, 8)
    out = torch.zeros(q.shape)
    with pytest.raises(ValueError, match="1 of 2 sequences not read"):  # past its table's width
        cpu_paged.paged_prefill_attention(q, k_cache, v_cache, tables, rows, query_lens, torch.tensor([0, 9]),
                                          1.0, out)
    bad = tables.clone()
    bad[1, 0] = 10_000
    with pytest.raises(ValueError, match="no block id outside"):
        cpu_paged.paged_prefill_attention(q, k_cache, v_cache, bad, rows, query_lens, context_starts, 1.0, out)
    with pytest.raises(ValueError, match="float32 only"):
        cpu_paged.paged_prefill_attention(q.double(), k_cache, v_cache, tables, rows, query_lens, context_starts,
                                          1.0, out)


def test_kernel_reads_views_and_any_thread_count():
    q, k_cache, v_cache, tables, lens = case([9, 33, 2], 4, 4, 2, 16, seed=1)
    wide = torch.randn(3, 4 * 16 * 2)  # q as a non-contiguous view of a wider row (like a fused QKV split)
    q = wide[:, :64].view(3, 4, 16)
    expected = paged_ops.paged_decode_attention(q, k_cache, v_cache, tables.long(), lens.long(), 0.5)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables.long(), lens.long(), 0.5)
            torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    finally:
        torch.set_num_threads(threads)


def test_store_writes_the_references_slots_from_views_of_the_fused_rows():
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(7, 4 * 16 + 2 * 2 * 16, generator=gen)  # (tokens, q | k | v), as the attention layer splits it
    k, v = qkv[:, 64:96].view(7, 2, 16), qkv[:, 96:].view(7, 2, 16)
    slots = torch.tensor([0, 5, 6, 31, 17, 2, 40])
    caches = [torch.full((11, 4, 2, 16), float("nan")) for _ in range(4)]
    cpu_paged.store_kv(k, v, caches[0], caches[1], slots)
    paged_ops.store_kv(k, v, caches[2], caches[3], slots)
    for got, expected in zip(caches[:2], caches[2:]):
        torch.testing.assert_close(got, expected, equal_nan=True, atol=0, rtol=0)  # untouched slots stay NaN


def test_store_refuses_slots_outside_the_cache_and_writes_no_other():
    k = torch.ones(3, 2, 8)
    k_cache, v_cache = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    for bad in (16, -1):
        with pytest.raises(IndexError, match=r"1 of 3 slots outside the cache's \[0, 16\)"):
            cpu_paged.store_kv(k, k, k_cache, v_cache, torch.tensor([0, bad, 2]))
    assert k_cache.view(16, 16).sum(1).tolist() == [16.0, 0, 16.0] + [0.0] * 13  # the good slots only
    with pytest.raises((IndexError, RuntimeError)):  # another dtype: the reference, with its own error
        cpu_paged.store_kv(k, k, k_cache, v_cache, torch.tensor([0, 99, 2], dtype=torch.int32))


def test_kernel_refuses_what_it_cannot_read_safely():
    q, k_cache, v_cache, tables, lens = case([5, 8], 4, 4, 2, 8)
    with pytest.raises(ValueError, match="context lengths must be in"):
        cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor([5, 9]), 1.0)  # past the width
    with pytest.raises(ValueError, match="context lengths must be in"):
        cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor([0, 3]), 1.0)
    with pytest.raises(ValueError, match="outside"):
        cpu_paged.paged_decode_attention(q, k_cache, v_cache, tables + 100, lens, 1.0)
    with pytest.raises(ValueError, match="float32 only"):
        cpu_paged.paged_decode_attention(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), tables, lens, 1.0)
    assert "float32 only" in cpu_paged.unavailable_reason("cpu", torch.bfloat16)
    assert "for the CPU" in cpu_paged.unavailable_reason("cuda")
    with pytest.raises(ValueError, match="exclude each other"):
        PagedKVCache(1, 4, 4, 2, 8, use_triton=True, use_cpu_kernel=True)
    with pytest.raises(ValueError, match="use_cpu_kernel must be None, True or False"):
        EngineConfig(use_cpu_kernel="yes")


def test_a_missing_compiler_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))
    cpu_paged._library.cache_clear()
    try:
        reason = cpu_paged.unavailable_reason()
        assert reason is not None and "no-such-compiler" in reason
        with pytest.raises(ValueError, match="cannot run here"):
            PagedKVCache(1, 4, 4, 2, 8, use_cpu_kernel=True)
    finally:
        monkeypatch.undo()
        cpu_paged._library.cache_clear()
    assert cpu_paged.unavailable_reason() is None  # the real compiler again


def test_an_unwritable_cache_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MINILLM_CACHE", str(blocked))
    cpu_paged._library.cache_clear()
    try:
        reason = cpu_paged.unavailable_reason()
        assert reason is not None and "not writable" in reason and "MINILLM_CACHE" in reason
    finally:
        monkeypatch.undo()
        cpu_paged._library.cache_clear()
    assert cpu_paged.unavailable_reason() is None


def test_kernel_inside_a_compiled_function():
    """An opaque operator to torch.compile: the compiled step calls it without a graph break."""
    q, k_cache, v_cache, tables, lens = case([7, 20], 4, 4, 2, 16, seed=2)

    def step(q, k_cache, v_cache, tables, lens):
        return cpu_paged.paged_decode_attention(q * 2, k_cache, v_cache, tables, lens, 0.25) + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k_cache, v_cache, tables, lens), step(q, k_cache, v_cache, tables, lens))


def test_huge_page_zeros_are_zeros():
    t = zeros_on_huge_pages((64, 16, 2, 64), torch.float32, "cpu")
    assert t.shape == (64, 16, 2, 64) and t.dtype == torch.float32 and not t.any()


@pytest.mark.parametrize("use_cpu_kernel", [True, False])
def test_engine_with_and_without_the_kernel_gives_the_naive_tokens(model, use_cpu_kernel):
    arrivals = [(0, [5, 6, 7], 40), (0, [8, 9], 35), (1, [10, 11, 12, 13], 30), (0, [14] * 19, 25)]
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=3, max_model_len=64, kv="paged",
                                                              block_size=4, use_cpu_kernel=use_cpu_kernel))
    assert (engine.cache.ops is cpu_paged) == use_cpu_kernel
    outputs = run_to_completion(engine, arrivals)
    for (_, prompt, n), got in zip(arrivals, outputs.values()):
        assert got == _reference(model, tuple(prompt), n)
