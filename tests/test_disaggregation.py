"""Prefill/decode disaggregation (chapter 13): the blocks a prompt's K/V arrive in, the pair of engine
cores giving the single engine's tokens, aborts at every stage freeing both sides, and a core lost."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest
import torch

from minillm import LLM, EngineConfig, SamplingParams
from minillm.attention.paged import PagedKVCache
from minillm.disagg.router import DisaggregatedLLM
from minillm.kv.block_pool import BlockPool
from tests.test_engine_core import PARAMS, PROMPTS

CONFIG = EngineConfig(max_num_seqs=6, max_model_len=256, kv="paged", block_size=16, prefix_cache=True)
LONG = "First Citizen:\nBefore we proceed any further, hear me speak. " * 8  # 6 blocks of K/V travel


# ---------------------------------------------------------------------------- the decode side's blocks
def test_adopted_blocks_become_cached_hits_with_exact_ids():
    pool = BlockPool(6, block_size=2, prefix_cache=True)
    writes, held = pool.adopt([1, 2, 3, 4, 5])  # two whole blocks; the 5th token is the request's to compute
    assert writes == [(0, 0), (1, 1)] and held == [0, 1]
    pool.release(held)
    assert pool.num_free_blocks == 6 and list(pool.evictable) == [1, 0]  # the tail first: evicted first
    assert [e.block_id for e in pool.find_cached([1, 2, 3, 4, 9])] == [0, 1]  # a prefix-cache hit
    writes, held = pool.adopt([1, 2, 3, 4, 6, 7])  # the first two are cached already: only the third is written
    assert writes == [(2, 2)] and held == [0, 1, 2]
    pool.release(held)
    assert pool.is_idle


def test_adopting_takes_no_more_than_the_free_blocks_and_never_evicts_its_own_chain():
    pool = BlockPool(3, block_size=2, prefix_cache=True)
    pool.allocate("running", 2)  # one block held by a running request
    writes, held = pool.adopt([1, 2, 3, 4, 5, 6, 7, 8])  # four blocks' worth, two free
    assert [index for index, _ in writes] == [0, 1]
    pool.release(held)
    writes, held = pool.adopt([1, 2, 3, 4, 5, 6])  # its chain is evictable: reused, not evicted for block 3
    assert writes == [] and len(held) == 2
    pool.release(held)
    pool.free("running")
    assert pool.is_idle
    with pytest.raises(ValueError, match="prefix cache"):
        BlockPool(2, 2).adopt([1, 2])


def test_blocks_read_from_one_cache_and_written_into_another_hold_the_same_kv():
    source, target = (PagedKVCache(3, 5, 4, 2, 8) for _ in range(2))
    for layer in source.k + source.v:
        layer.copy_(torch.randn_like(layer))
    kv = source.read_blocks([3, 1])  # (2, layers, blocks, block_size, kv_heads, head_dim)
    assert kv.shape == (2, 3, 2, 4, 2, 8)
    target.write_blocks([0, 4], kv)
    for mine, theirs in zip(target.k + target.v, source.k + source.v):
        assert torch.equal(mine[0], theirs[3]) and torch.equal(mine[4], theirs[1])
    with pytest.raises(ValueError, match="int8 codes"):
        PagedKVCache(1, 2, 4, 1, 8, kv_cache_dtype="int8").read_blocks([0])


# ---------------------------------------------------------------------------- the pair of engines
@pytest.fixture(scope="module")
def pair():
    llm = DisaggregatedLLM(config=CONFIG, threads=(1, 1))
    yield llm
    llm.close()
    for pid in (llm.core_pid, llm.prefill_pid):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def both_idle(llm: DisaggregatedLLM) -> bool:
    return llm.gauges().get("kv_blocks_used") == 0 and llm.prefill_gauges.get("kv_blocks_used") == 0


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert condition()


def test_the_pair_gives_the_single_engines_tokens_text_and_logprobs(pair):
    """Greedy, seeded sampling, n samples, stop strings, logprobs: the decode engine computes what the single
    engine computes, minus the prompt blocks it received."""
    prompts, params = [*PROMPTS, LONG], [*PARAMS, SamplingParams(temperature=0, max_new_tokens=30)]
    expected = LLM(config=CONFIG).generate(prompts, params, use_tqdm=False)

    async def go():
        return await asyncio.gather(*[pair.submit(p, sp) for p, sp in zip(prompts, params)])

    got = asyncio.run(go())
    for want, have in zip(expected, got):
        assert [o.token_ids for o in have.outputs] == [o.token_ids for o in want.outputs]
        assert [o.text for o in have.outputs] == [o.text for o in want.outputs]
        assert [o.finish_reason for o in have.outputs] == [o.finish_reason for o in want.outputs]
    assert got[-1].num_cached_tokens >= 4 * 16  # the long prompt's blocks came from the prefill engine
    handles = [h for h, _ in pair.transfers]
    assert any(h.num_blocks >= 4 for h in handles)
    kinds = {(lane, kind) for lane, kind, *_ in pair.lane_spans}
    assert {("prefill worker", "prefill"), ("prefill worker", "send KV"), ("decode worker", "receive KV"),
            ("decode worker", "decode")} <= kinds
    asyncio.run(until(lambda: both_idle(pair)))


def test_aborts_before_during_and_after_the_transfer_free_both_sides(pair):
    params = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    forward = pair._apply_prefill
    held: list = []

    def abort_in_transit(step):  # the handle is posted, the decode core has not been told yet
        for handle in step.kv_sent:
            state = pair._live.get(handle.request_id)
            if state is not None and state.request_id == "in-transit":
                pair.abort("in-transit")
                held.append(handle)
        forward(step)

    async def go():
        pair._apply_prefill = abort_in_transit
        try:
            before = pair.submit(LONG, params, request_id="before")
            pair.abort("before")  # still queued at the prefill core (or computing there)
            in_transit = pair.submit(LONG + "x", params, request_id="in-transit")
            after = pair.submit(LONG + "y", params, request_id="after")
            await until(lambda: any(h.request_id == pair._core_id_of.get("after") for h, _ in pair.transfers))
            await asyncio.sleep(0.2)  # decoding at the decode core now
            pair.abort("after")
            neighbour = await pair.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=8))
            outs = await asyncio.gather(before, in_transit, after)
        finally:
            pair._apply_prefill = forward
        assert [o.finish_reason for o in outs] == ["abort"] * 3
        assert held and held[0].num_blocks >= 4  # it was sent, then dropped by the decode core
        assert neighbour.finish_reason == "length"
        await until(lambda: both_idle(pair))

    asyncio.run(go())


def test_a_prefill_core_killed_ends_the_requests_in_flight_with_its_reason():
    llm = DisaggregatedLLM(config=CONFIG, threads=(1, 1))
    try:
        async def go():
            future = llm.submit(LONG, SamplingParams(temperature=0, max_new_tokens=100))
            llm._prefill.process.kill()
            out = await asyncio.wait_for(future, timeout=20)
            assert out.finish_reason == "error" and "prefill core" in out.error
            assert "prefill core" in llm.error
            with pytest.raises(RuntimeError, match="not running"):
                await llm.submit("ROMEO:", SamplingParams(max_new_tokens=2))

        asyncio.run(go())
    finally:
        llm.close()
    for pid in (llm.core_pid, llm.prefill_pid):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_configs_without_a_paged_prefix_cache_are_refused():
    with pytest.raises(ValueError, match="prefix_cache=True"):
        DisaggregatedLLM(config=EngineConfig(kv="paged"))


def test_the_server_in_front_of_the_pair_answers_the_openai_sdk(pair):
    """The router is the server's engine (`serve --disaggregate`): the SDK's completions, whole and streamed."""
    openai = pytest.importorskip("openai")
    from minillm.server import build_app
    from tests.test_server import _Server

    server = _Server(build_app(pair, "minillm-target"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        expected = LLM(config=CONFIG).generate([LONG, "ROMEO:"], SamplingParams(temperature=0, max_new_tokens=12),
                                               use_tqdm=False)
        whole = client.completions.create(model="minillm-target", prompt=LONG, max_tokens=12, temperature=0)
        assert whole.choices[0].text == expected[0].text
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
            model="minillm-target", prompt="ROMEO:", max_tokens=12, temperature=0, stream=True) if chunk.choices)
        assert streamed == expected[1].text
    finally:
        server.stop()
    asyncio.run(until(lambda: both_idle(pair)))
