"""Chapter 8's fixed-shape decode step: padding rows touch only the pad block, the buffers are
refilled in place, the static step equals the eager one exactly, and the engine through recorded
steps ("eager" recording here: the same path as compile and CUDA Graphs, without the compile time)
gives the naive loop's greedy tokens across every bucket edge, with preemption, the prefix cache,
chunked prefill, speculative decoding and aborts. tests/test_compiled_decode.py compiles it."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.attention import cpu_paged, paged_ops
from minillm.attention.paged import PagedKVCache
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.graphs.decode_step import decode_step
from minillm.graphs.padding import DecodeRow, pad_decode_batch
from minillm.graphs.recorded_decode import RecordedDecode
from minillm.graphs.static_inputs import StaticDecodeInputs
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from tests.test_engine import _reference, paged_budget


def test_padding_rows_write_and_read_only_the_pad_block():
    rows = [DecodeRow(7, 9, [3, 0, 5]), DecodeRow(8, 2, [4]), DecodeRow(9, 5, [1, 2])]
    batch = pad_decode_batch(rows, bucket=4, width=3, block_size=4, pad_block=6)
    assert batch.input_ids == [7, 8, 9, 0] and batch.positions == [9, 2, 5, 0]
    assert batch.slot_mapping == [5 * 4 + 1, 4 * 4 + 2, 2 * 4 + 1, 6 * 4]
    assert batch.block_tables == [[3, 0, 5], [4, 6, 6], [1, 2, 6], [6, 6, 6]]
    assert batch.context_lens == [10, 3, 6, 1] and batch.num_real == 3
    padded = pad_decode_batch([], bucket=2, width=2, block_size=8, pad_block=0)
    assert padded.slot_mapping == [0, 0] and padded.block_tables == [[0, 0], [0, 0]]


@pytest.mark.parametrize(("rows", "bucket", "width", "match"), [
    ([DecodeRow(1, 0, [0])] * 3, 2, 4, "do not fit a bucket"),
    ([DecodeRow(1, 8, [0, 1])], 1, 4, "needs more than 2 blocks"),  # position 8 lives in block index 2
    ([DecodeRow(1, 0, [0, 1, 2, 3, 4])], 1, 4, "at most 4"),
    ([DecodeRow(1, 0, [9])], 1, 4, "pad block"),
])
def test_rows_that_do_not_fit_are_refused(rows, bucket, width, match):
    with pytest.raises(ValueError, match=match):
        pad_decode_batch(rows, bucket, width, block_size=4, pad_block=9)


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 47)), max_size=8), st.integers(0, 4))
def test_any_batch_touches_no_block_but_its_own_and_the_pad(rows, extra):
    block_size, pad = 16, 99
    tables = [list(range(10 * i, 10 * i + position // block_size + 1)) for i, (_, position) in enumerate(rows)]
    batch = pad_decode_batch([DecodeRow(t, p, table) for (t, p), table in zip(rows, tables)], len(rows) + extra,
                             width=3, block_size=block_size, pad_block=pad)
    for i, (slot, table, context) in enumerate(zip(batch.slot_mapping, batch.block_tables, batch.context_lens)):
        allowed = set(tables[i]) if i < len(rows) else set()
        assert slot // block_size in allowed | ({pad} if i >= len(rows) else set())
        assert {b for b in table[: -(-context // block_size)]} <= (allowed or {pad})  # what attention reads


def test_buffers_are_refilled_in_place():
    inputs = StaticDecodeInputs(batch_size=4, width=3, block_size=4, pad_block=6)
    addresses = [t.data_ptr() for t in inputs.tensors]
    assert inputs.slot_mapping.tolist() == [24] * 4 and inputs.block_tables.tolist() == [[6] * 3] * 4
    for rows in ([DecodeRow(7, 9, [3, 0, 5])], [DecodeRow(1, 0, [2]), DecodeRow(2, 4, [0, 1])]):
        batch = pad_decode_batch(rows, 4, 3, 4, 6)
        inputs.fill(batch)
        assert [t.data_ptr() for t in inputs.tensors] == addresses
        assert inputs.input_ids.tolist() == batch.input_ids and inputs.block_tables.tolist() == batch.block_tables
        assert inputs.context_lens.tolist() == batch.context_lens and inputs.slot_mapping.tolist() == batch.slot_mapping
    with pytest.raises(ValueError, match="4 rows x 3 blocks"):
        inputs.fill(pad_decode_batch([], 2, 3, 4, 6))


def test_the_static_step_equals_the_eager_forward_and_writes_only_its_slots(model):
    torch.manual_seed(0)
    c = model.config
    cache = PagedKVCache(c.num_layers, 12, 4, c.num_kv_heads, c.head_dim, pad_block=True)
    for t in cache.k + cache.v:
        t.normal_()
    tables, positions, tokens = [[3, 0, 5], [4], [1, 2]], [9, 2, 5], [7, 8, 9]
    eager_cache = [t.clone() for t in cache.k], [t.clone() for t in cache.v]
    eager = PagedKVCache(c.num_layers, 12, 4, c.num_kv_heads, c.head_dim, pad_block=True)
    eager.k, eager.v = eager_cache
    with torch.inference_mode():
        backend = eager.batch(tables, positions, [1, 1, 1])
        expected = model.logits(model(torch.tensor(tokens), torch.tensor(positions), backend))
        inputs = StaticDecodeInputs(8, 4, 4, cache.pad_block)
        inputs.fill(pad_decode_batch([DecodeRow(t, p, b) for t, p, b in zip(tokens, positions, tables)], 8, 4, 4,
                                     cache.pad_block))
        got = decode_step(model, cache.k, cache.v, *inputs.tensors)
    torch.testing.assert_close(got[:3], expected, rtol=1e-5, atol=1e-5)
    for layer in range(c.num_layers):  # every real block as the eager pass left it; only the pad block differs
        torch.testing.assert_close(cache.k[layer][:12], eager.k[layer][:12], rtol=1e-5, atol=1e-5)  # K is O(1)
        assert not torch.equal(cache.k[layer][12], eager.k[layer][12])


def test_recorded_decode_runs_only_pure_decode_steps_within_its_buckets(model):
    c = model.config
    cache = PagedKVCache(c.num_layers, 8, 4, c.num_kv_heads, c.head_dim, pad_block=True)
    recorded = RecordedDecode(model, cache, [1, 2, 4], "eager", max_blocks_per_seq=4)
    from minillm.scheduler.output import ScheduledChunk

    def chunk(n: int, **kw) -> ScheduledChunk:
        return ScheduledChunk("r", 0, 3, tuple(range(n)), True, False, block_table=(0,), **kw)

    assert recorded.accepts([chunk(1)] * 4) and not recorded.accepts([chunk(1)] * 5)
    assert not recorded.accepts([chunk(1), chunk(2)]) and not recorded.accepts([])
    assert not recorded.accepts([chunk(1, is_padding=True)])
    logits, bucket = recorded.run([chunk(1)] * 3)
    assert logits.shape == (3, c.vocab_size) and bucket == 4
    with pytest.raises(ValueError, match="pad block"):
        RecordedDecode(model, PagedKVCache(c.num_layers, 8, 4, c.num_kv_heads, c.head_dim), [1], "eager", 4)
    with pytest.raises(ValueError, match="CUDA device"):
        RecordedDecode(model, cache, [1], "cuda_graphs", 4)


def recorded_engine(model, buckets=(1, 2, 4), max_num_seqs: int = 6, block_size: int = 8, num_blocks: int = 48,
                    **overrides) -> LLMEngine:
    config = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, kv="paged", block_size=block_size,
                          kv_cache_bytes=paged_budget(model, block_size, num_blocks), compile=True,
                          graph_batch_sizes=buckets, **overrides)
    engine = LLMEngine(model, ByteTokenizer(), config)
    recorded = engine.runner.recorded  # the same path as compile=True, run eagerly: no compile time in this test
    engine.runner.recorded = RecordedDecode(model, engine.cache, recorded.buckets, "eager", recorded.width)
    return engine


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


arrivals_strategy = st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(3, 255), min_size=1, max_size=12),
                                       st.integers(1, 20)), min_size=1, max_size=7)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=arrivals_strategy, num_blocks=st.integers(8, 48), features=st.sampled_from(
    ["plain", "prefix", "chunked", "ngram"]), abort_at=st.integers(0, 30))
def test_recorded_steps_give_the_naive_loops_tokens(model, arrivals, num_blocks, features, abort_at):
    overrides = {"prefix": {"prefix_cache": True}, "chunked": {"chunked_prefill": True,
                                                               "max_tokens_per_prefill_chunk": 5},
                 "ngram": {"speculative": SpeculativeConfig("ngram", 2)}, "plain": {}}[features]
    engine = recorded_engine(model, num_blocks=num_blocks, **overrides)
    ids, doomed = [], None
    for i, (wait, prompt, n) in enumerate(arrivals):
        for _ in range(wait):
            if engine.has_unfinished():
                engine.step()
        ids.append(engine.add_request(prompt, greedy(n)).request_id)
        if i == 1:
            doomed = ids[-1]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == abort_at and doomed is not None:
            engine.abort(doomed)
    for request_id, (_, prompt, n) in zip(ids, arrivals):
        out = engine.output(request_id)
        if out.finish_reason == "abort":
            assert out.token_ids == _reference(model, tuple(prompt), n)[: len(out.token_ids)]
        else:
            assert out.token_ids == _reference(model, tuple(prompt), n)


def test_every_bucket_edge_and_the_eager_path_above_the_largest(model):
    engine = recorded_engine(model, num_blocks=80)
    prompts = [[5 + i, 6, 7 + i] for i in range(6)]
    ids = [engine.add_request(p, greedy(14 - 2 * i)).request_id for i, p in enumerate(prompts)]  # 6 -> 1 decoding
    while engine.has_unfinished():
        engine.step()
    for request_id, (i, prompt) in zip(ids, enumerate(prompts)):
        assert engine.output(request_id).token_ids == _reference(model, tuple(prompt), 14 - 2 * i)
    used = {(step.decode_tokens, step.recorded_batch) for step in engine.trace.steps if step.decode_tokens}
    assert {(1, 1), (2, 2), (3, 4), (4, 4), (6, None)} <= used  # 5 and 6 decodes: above the largest bucket
    assert all(batch is None for n, batch in used if n > 4)


def test_seeded_sampling_is_the_same_through_recorded_steps(model):
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_new_tokens=20, ignore_eos=True) for s in range(3)]
    results = []
    for recorded in (False, True):
        config = EngineConfig(max_num_seqs=4, max_model_len=64, kv="paged", block_size=8)
        engine = recorded_engine(model) if recorded else LLMEngine(model, ByteTokenizer(), config)
        ids = [engine.add_request([5 + i, 6], p).request_id for i, p in enumerate(params)]
        while engine.has_unfinished():
            engine.step()
        results.append([engine.output(i).token_ids for i in ids])
    assert results[0] == results[1]
    assert any(step.recorded_batch for step in engine.trace.steps)


def test_config_refuses_what_cannot_be_recorded(model):
    with pytest.raises(ValueError, match="not both"):
        EngineConfig(kv="paged", compile=True, cuda_graphs=True)
    with pytest.raises(ValueError, match="needs kv='paged'"):
        EngineConfig(compile=True)
    with pytest.raises(ValueError, match="graph_batch_sizes"):
        EngineConfig(kv="paged", compile=True, max_num_seqs=4, graph_batch_sizes=(1, 8))
    with pytest.raises(ValueError, match="graph_batch_sizes"):
        EngineConfig(kv="paged", compile=True, graph_batch_sizes=())
    assert EngineConfig(kv="paged", compile=True, graph_batch_sizes=[4, 1, 4]).graph_batch_sizes == (1, 4)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
            LLMEngine(model, ByteTokenizer(), EngineConfig(kv="paged", cuda_graphs=True, max_model_len=64))


def test_every_bucket_shares_the_largest_buckets_memory(model):
    engine = recorded_engine(model, buckets=(1, 2, 4), num_blocks=10)
    inputs = engine.runner.recorded.inputs
    for name in ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens"):
        assert len({getattr(inputs[b], name).data_ptr() for b in (1, 2, 4)}) == 1
        assert [getattr(inputs[b], name).shape[0] for b in (1, 2, 4)] == [1, 2, 4]
    with pytest.raises(ValueError, match="1..4 rows"):
        inputs[4].first_rows(5)


def test_a_narrower_batch_fills_the_first_columns_only():
    inputs = StaticDecodeInputs(batch_size=2, width=4, block_size=4, pad_block=6)
    inputs.fill(pad_decode_batch([DecodeRow(1, 9, [3, 0, 5]), DecodeRow(2, 0, [4])], 2, 4, 4, 6))
    inputs.fill(pad_decode_batch([DecodeRow(1, 2, [7])], 2, 2, 4, 6))  # 2 columns: the last two keep old ids
    assert inputs.block_tables.tolist() == [[7, 6, 5, 6], [6, 6, 6, 6]]
    assert inputs.context_lens.tolist() == [3, 1]  # which never reach past the first column
    with pytest.raises(ValueError, match="2 rows x 4 blocks"):
        inputs.fill(pad_decode_batch([DecodeRow(1, 2, [7])], 2, 5, 4, 6))


def test_the_pad_block_is_outside_the_pool(model):
    engine = recorded_engine(model, num_blocks=10)
    assert engine.pool.num_blocks == 10 == engine.cache.pad_block and engine.cache.k[0].shape[0] == 11
    assert "+1 pad block" in engine.cache.describe()
    assert engine.cache.ops in (paged_ops, cpu_paged)  # on a CPU: the torch reference or the C decode kernel
