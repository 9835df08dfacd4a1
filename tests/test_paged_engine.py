"""The engine on a paged KV cache: token-exact with any block size, through forced preemptions,
with seeded sampling, aborts, and requests that can never fit. (tests/conftest.py checks after
each test that every block is back in the pool.)"""

import pytest

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.request import RequestStatus
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from tests.test_engine import _reference, paged_budget, run_to_completion

ARRIVALS = [(0, [5, 6, 7], 40), (0, [8, 9], 35), (1, [10, 11, 12, 13], 30), (0, [14] * 9, 25), (2, [20, 21], 30)]


def paged_engine(model, block_size: int, num_blocks: int, **overrides) -> LLMEngine:
    config = EngineConfig(max_num_seqs=4, max_model_len=64, kv="paged", block_size=block_size,
                          kv_cache_bytes=paged_budget(model, block_size, num_blocks), **overrides)
    return LLMEngine(model, ByteTokenizer(), config)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_forced_preemption_changes_no_token(model, block_size):
    # room for ~1.5 of the longest requests: the engine must preempt again and again
    num_blocks = -(-64 // block_size) * 3 // 2
    engine = paged_engine(model, block_size, num_blocks)
    outputs = run_to_completion(engine, ARRIVALS)
    preemptions = [rid for step in engine.trace.steps for rid in step.preempted]
    assert len(preemptions) >= 2, f"the pool was meant to force preemptions, got {preemptions}"
    assert any(r.num_preemptions for r in engine.requests.values())
    for (_, prompt, n), got in zip(ARRIVALS, outputs.values()):
        assert got == _reference(model, tuple(prompt), n)


def test_blocks_grow_with_the_tokens(model):
    engine = paged_engine(model, block_size=8, num_blocks=40)
    run_to_completion(engine, ARRIVALS)
    checked = 0
    for step in engine.trace.steps:
        for rid, tokens in step.kv_tokens.items():
            assert len(step.blocks[rid]) == -(-tokens // 8)  # exactly the blocks its cached tokens need
            checked += 1
    assert checked > 50 and not any(step.preempted for step in engine.trace.steps)


def test_seeded_sampling_survives_preemption(model):
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_new_tokens=30, ignore_eos=True) for s in range(4)]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [14] * 9]
    results = []
    for engine in (LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=4, max_model_len=64)),
                   paged_engine(model, block_size=8, num_blocks=12)):
        ids = [engine.add_request(p, sp).request_id for p, sp in zip(prompts, params)]
        while engine.has_unfinished():
            engine.step()
        results.append([engine.output(i).token_ids for i in ids])
    assert any(step.preempted for step in engine.trace.steps)
    assert results[0] == results[1]


def test_a_request_that_can_never_fit_is_rejected_and_the_rest_served(model):
    engine = paged_engine(model, block_size=8, num_blocks=3)  # 24 tokens of KV in all
    with pytest.raises(ValueError, match="never fit"):
        engine.add_request([5] * 10, SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True))
    out = run_to_completion(engine, [(0, [5, 6], 10), (0, [7, 8], 12)])
    assert list(out.values()) == [_reference(model, (5, 6), 10), _reference(model, (7, 8), 12)]


def test_aborting_running_and_preempted_requests_frees_their_blocks(model):
    engine = paged_engine(model, block_size=8, num_blocks=10)
    greedy = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    ids = [engine.add_request(p, greedy).request_id for p in ([5, 6, 7], [8, 9], [10, 11], [12, 13])]
    preempted = None
    while preempted is None:
        engine.step()
        preempted = next((r for r in engine.requests.values() if r.status is RequestStatus.PREEMPTED), None)
    running = engine.scheduler.running[0]
    assert engine.abort(preempted.request_id) and engine.abort(running.request_id)
    while engine.has_unfinished():
        engine.step()
    for i, prompt in zip(ids, ([5, 6, 7], [8, 9], [10, 11], [12, 13])):
        out = engine.output(i)
        if i in (preempted.request_id, running.request_id):
            assert out.finish_reason == "abort"
        else:
            assert out.token_ids == _reference(model, tuple(prompt), 40)


def test_kv_budget_gives_the_number_of_blocks(model):
    engine = paged_engine(model, block_size=16, num_blocks=7)
    assert engine.pool.num_blocks == engine.cache.num_blocks == 7
    assert "7 blocks" in engine.cache.describe()
    default = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=3, max_model_len=64, kv="paged"))
    assert default.pool.num_blocks * 16 == 3 * 64  # by default: what the contiguous cache would reserve
    # ... in whole blocks: 60 tokens need 4 blocks of 16 (rounding down to 3 refused a 60-token request)
    odd = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=1, max_model_len=60, kv="paged"))
    assert odd.pool.num_blocks == 4
    request = odd.add_request(list(range(3, 58)), SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True))
    while odd.has_unfinished():
        odd.step()
    assert len(odd.output(request.request_id).token_ids) == 5
    with pytest.raises(ValueError, match="holds no block"):
        LLMEngine(model, ByteTokenizer(), EngineConfig(kv="paged", kv_cache_bytes=10))
    with pytest.raises(ValueError, match="continuous"):
        EngineConfig(batching="static", kv="paged")


def test_the_engine_runs_the_triton_kernels(model):
    """use_triton=True wires minillm/attention/triton_paged.py into the engine (interpreted on CPU,
    tests/conftest.py sets TRITON_INTERPRET): same tokens, with a preemption on the way."""
    pytest.importorskip("triton")
    engine = paged_engine(model, block_size=8, num_blocks=5, use_triton=True)
    assert engine.cache.ops.__name__ == "minillm.attention.triton_paged"
    arrivals = [(0, [5, 6, 7], 12), (0, [8, 9], 14), (0, [10, 11, 12, 13], 10)]
    outputs = run_to_completion(engine, arrivals)
    assert any(step.preempted for step in engine.trace.steps)
    for (_, prompt, n), got in zip(arrivals, outputs.values()):
        assert got == _reference(model, tuple(prompt), n)


def test_triton_needs_a_power_of_two_block_size(model):
    pytest.importorskip("triton")
    with pytest.raises(ValueError, match="power-of-two"):
        paged_engine(model, block_size=12, num_blocks=8, use_triton=True)


def test_async_api_on_the_paged_cache(model):
    import asyncio

    from minillm.async_engine import AsyncLLM

    llm = AsyncLLM(engine=paged_engine(model, block_size=8, num_blocks=8))
    greedy = SamplingParams(temperature=0, max_new_tokens=25, ignore_eos=True)
    prompts = {"a": [5, 6, 7], "b": [8, 9], "c": [10, 11, 12], "d": [13, 14]}

    async def scenario():
        futures = {rid: llm.submit(p, greedy, request_id=rid) for rid, p in prompts.items()}
        requests = llm.engine.requests
        while not futures["b"].done() and ("b" not in requests or len(requests["b"].output_token_ids) < 2):
            await asyncio.sleep(0.001)  # abort b mid-generation
        llm.abort("b")
        return {rid: await f for rid, f in futures.items()}

    outs = asyncio.run(scenario())
    assert outs["b"].finish_reason == "abort" and 2 <= len(outs["b"].token_ids) < 25
    assert outs["b"].token_ids == _reference(model, tuple(prompts["b"]), 25)[: len(outs["b"].token_ids)]
    for rid in "acd":
        assert outs[rid].token_ids == _reference(model, tuple(prompts[rid]), 25)
    assert any(step.preempted for step in llm.engine.trace.steps)


def test_start_up_reports_blocks_and_bytes_per_token(model, caplog):
    with caplog.at_level("INFO", logger="minillm"):
        engine = paged_engine(model, block_size=16, num_blocks=5)
    assert engine.cache.bytes_per_token == 1024  # 2 (K, V) x 2 layers x 2 KV heads x 32 dims x 4 bytes
    assert "5 blocks x 16 tokens = 80 tokens, 1.0 KiB per token, 80.0 KiB" in caplog.text
