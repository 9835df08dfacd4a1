"""The engine (static and continuous batching, contiguous and paged KV) reproduces chapter 1's naive
loop token for token, for any arrival order and limits; aborts and invalid requests never disturb
the others. `tests/conftest.py` checks after every test that no slot or KV block leaked."""

import asyncio
import dataclasses
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.async_engine import AsyncLLM
from minillm.attention.paged import kv_bytes_per_token
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.generate import generate_without_cache
from minillm.model import load_model
from minillm.request import RequestStatus
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer


@functools.cache
def _reference(model, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    return generate_without_cache(model, ByteTokenizer(), list(prompt), params).token_ids


def run_to_completion(engine: LLMEngine, arrivals: list[tuple[int, list[int], int]]) -> dict[str, list[int]]:
    """arrivals: (steps to run before adding, prompt, max_new_tokens). Returns outputs by id."""
    ids = []
    for wait, prompt, n in arrivals:
        for _ in range(wait):
            if engine.has_unfinished():
                engine.step()
        ids.append(engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True))
                   .request_id)
    while engine.has_unfinished():
        engine.step()
    return {i: engine.output(i).token_ids for i in ids}


requests_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(3, 255), min_size=1, max_size=30), st.integers(1, 12)),
    min_size=1, max_size=8)


def paged_budget(model, block_size: int, num_blocks: int, draft: str | None = None) -> int:
    """The kv_cache_bytes that give `num_blocks` blocks — with a draft model (its folder), blocks that
    hold the draft's K/V beside the target's."""
    models = [model] if draft is None else [model, load_model(draft)]
    per_token = sum(kv_bytes_per_token(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim, m.dtype)
                    for m in models)
    return num_blocks * block_size * per_token


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=requests_strategy, kind=st.sampled_from(["static", "continuous", "paged"]),
       max_num_seqs=st.integers(1, 5), budget=st.integers(30, 120), block_size=st.sampled_from([8, 16, 32]),
       spare_blocks=st.integers(0, 8))
def test_any_arrival_order_and_limits_give_the_naive_loops_tokens(model, arrivals, kind, max_num_seqs, budget,
                                                                  block_size, spare_blocks):
    config = EngineConfig(batching="static" if kind == "static" else "continuous", max_num_seqs=max_num_seqs,
                          max_model_len=64, max_tokens_per_step=budget)
    if kind == "paged":  # a pool just big enough for the longest request, plus a few blocks: preemptions happen
        longest = max(min(len(p) + n, 64) for _, p, n in arrivals)
        num_blocks = -(-longest // block_size) + spare_blocks
        # a preempted request recomputes all its tokens in one step: the engine refuses one that could outgrow
        # the step budget (unless chunked), so here the budget covers the longest request
        config = dataclasses.replace(config, kv="paged", block_size=block_size,
                                     max_tokens_per_step=max(budget, longest),
                                     kv_cache_bytes=paged_budget(model, block_size, num_blocks))
    engine = LLMEngine(model, ByteTokenizer(), config)
    outputs = run_to_completion(engine, arrivals)
    for (_, prompt, n), got in zip(arrivals, outputs.values()):
        assert got == _reference(model, tuple(prompt), n)


def test_continuous_refills_slots_that_static_leaves_idle(model):
    # the source chapter's example: three requests generating 10, 100 and 30 tokens, two slots
    arrivals = [(0, [5, 6, 7], 10), (0, [8, 9], 100), (0, [10, 11, 12, 13], 30)]
    traces = {}
    for batching in ("static", "continuous"):
        engine = LLMEngine(model, ByteTokenizer(), EngineConfig(batching=batching, max_num_seqs=2, max_model_len=128))
        outputs = run_to_completion(engine, arrivals)
        assert [len(v) for v in outputs.values()] == [10, 100, 30]
        traces[batching] = engine.trace
    static, continuous = traces["static"], traces["continuous"]
    assert len(continuous.steps) < len(static.steps)
    assert continuous.slot_utilisation > static.slot_utilisation
    idle = [s for step in static.steps for s in step.slots if s is not None and s.phase == "idle"]
    assert idle, "static batching keeps finished requests' slots idle"


def test_prefill_and_decode_share_one_forward_pass(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=4, max_model_len=64))
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True))
    engine.step()
    engine.add_request([8, 9, 10, 11], SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True))
    engine.step()
    phases = sorted(s.phase for s in engine.trace.steps[-1].slots if s is not None)
    assert phases == ["decode", "prefill"]
    while engine.has_unfinished():
        engine.step()


def test_aborting_one_request_leaves_the_others_unchanged(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=3, max_model_len=64))
    prompts = [[5, 6, 7], [40, 41], [90, 91, 92, 93]]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)).request_id
           for p in prompts]
    for _ in range(6):
        engine.step()
    assert engine.abort(ids[1])
    assert not engine.abort(ids[1])  # twice is a no-op
    while engine.has_unfinished():
        engine.step()
    for i, prompt in zip(ids, prompts):
        out = engine.output(i)
        ref = _reference(model, tuple(prompt), 20)
        if i == ids[1]:
            assert out.finish_reason == "abort" and engine.requests[i].status is RequestStatus.ABORTED
            assert out.token_ids == ref[: len(out.token_ids)] and len(out.token_ids) < 20
        else:
            assert out.token_ids == ref


def test_invalid_requests_get_their_own_error_and_the_rest_is_served(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=2, max_model_len=32, max_tokens_per_step=20))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="context"):
        engine.add_request([5] * 40, SamplingParams())
    with pytest.raises(ValueError, match="max_tokens_per_step"):
        engine.add_request([5] * 25, SamplingParams())
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.add_request([5], {"temperature": 0})
    out = run_to_completion(engine, [(0, [5, 6], 4)])
    assert list(out.values()) == [_reference(model, (5, 6), 4)]


def test_generation_stops_at_max_model_len(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=1, max_model_len=16))
    rid = engine.add_request([5] * 10, SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True)).request_id
    while engine.has_unfinished():
        engine.step()
    out = engine.output(rid)
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


def test_engine_config_validation_names_the_field():
    for field, value in [("batching", "dynamic"), ("max_num_seqs", 0), ("max_model_len", 1),
                         ("max_tokens_per_step", 0), ("kv", "paged-ish"), ("device", "tpu"), ("dtype", "int8"),
                         ("block_size", 0), ("kv_cache_bytes", 0), ("gpu_memory_utilization", 1.5),
                         ("use_triton", "yes")]:
        with pytest.raises(ValueError, match=field):
            EngineConfig(**{field: value})


def test_async_submit_stream_and_abort(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=2, max_model_len=64))
    llm = AsyncLLM(engine=engine)
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)

    async def scenario():
        a = llm.submit([5, 6, 7], greedy)
        b = llm.submit([40, 41], greedy, request_id="b")
        bad = llm.submit([], greedy)
        assert not a.done()  # submit returns at once
        llm.abort("b")
        deltas = [d async for d in llm.stream([60, 61, 62], greedy)]
        with pytest.raises(ValueError, match="empty"):
            await bad
        return await a, await b, "".join(deltas)

    out_a, out_b, streamed = asyncio.run(scenario())
    assert out_a.token_ids == _reference(model, (5, 6, 7), 12)
    assert out_b.finish_reason == "abort"
    assert streamed == ByteTokenizer().decode(_reference(model, (60, 61, 62), 12))
