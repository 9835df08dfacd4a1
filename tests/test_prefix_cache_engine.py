"""The engine with a prefix cache gives exactly the tokens it gives without one — and chapter 1's
naive loop's — whatever is shared, evicted, aborted or preempted. `tests/conftest.py` checks after
every test that each block is free or cached with a zero reference count."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from tests.test_engine import _reference, paged_budget, run_to_completion

PREFIXES = [list(range(40, 72)), list(range(40, 56)) + [9] * 16, [200 + i % 7 for i in range(24)]]  # shared starts


def cached_engine(model, block_size: int, num_blocks: int, prefix_cache: bool = True, **overrides) -> LLMEngine:
    settings = {"max_num_seqs": 4, "max_model_len": 96} | overrides
    config = EngineConfig(kv="paged", block_size=block_size, kv_cache_bytes=paged_budget(model, block_size, num_blocks),
                          prefix_cache=prefix_cache, **settings)
    return LLMEngine(model, ByteTokenizer(), config)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


workload = st.lists(st.tuples(st.integers(0, 3),  # steps to run before it arrives
                              st.integers(0, len(PREFIXES) - 1),  # which shared prefix
                              st.integers(0, 40),  # how much of it (0..32: on and off block boundaries)
                              st.lists(st.integers(3, 255), max_size=10),  # its own tail
                              st.integers(1, 10),  # new tokens
                              st.booleans()),  # sampled with a seed instead of greedy
                    min_size=1, max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=workload, block_size=st.sampled_from([8, 16, 32]), spare_blocks=st.integers(0, 6),
       abort_at=st.one_of(st.none(), st.tuples(st.integers(0, 7), st.integers(0, 6))))
def test_shared_prefixes_give_the_same_tokens_with_and_without_the_cache(model, arrivals, block_size, spare_blocks,
                                                                         abort_at):
    requests = [(wait, (PREFIXES[p][:cut] + tail) or [5], n) for wait, p, cut, tail, n, _ in arrivals]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_new_tokens=n, ignore_eos=True) if sampled
              else greedy(n) for i, (_, _, _, _, n, sampled) in enumerate(arrivals)]
    longest = max(len(prompt) + n for _, prompt, n in requests)
    num_blocks = -(-longest // block_size) + spare_blocks  # small: cached blocks get evicted, requests preempted
    results = {}
    for prefix_cache in (False, True):
        engine = cached_engine(model, block_size, num_blocks, prefix_cache)
        for repeat in range(2):  # the second round finds the first round's blocks (fully cached prompts too)
            ids = []
            for (wait, prompt, _), p in zip(requests, params):
                for _ in range(wait):
                    if engine.has_unfinished():
                        engine.step()
                ids.append(engine.add_request(prompt, p).request_id)
            step = 0
            while engine.has_unfinished():
                if abort_at is not None and repeat == 0 and step == abort_at[1] and abort_at[0] < len(ids):
                    engine.abort(ids[abort_at[0]])
                engine.step()
                step += 1
            results[prefix_cache, repeat] = [engine.output(i) for i in ids]
            for i in ids:
                engine.release(i)
    for repeat in range(2):
        plain, cached = results[False, repeat], results[True, repeat]
        for (_, prompt, n), p, a, b in zip(requests, params, plain, cached):
            if a.finish_reason == "abort" or b.finish_reason == "abort":
                continue  # the abort may land at a different token with and without the cache
            assert a.token_ids == b.token_ids  # seeded sampling too: the cache changes no token
            if p.greedy:
                assert a.token_ids == _reference(model, tuple(prompt), n)


def test_a_repeated_prompt_is_served_from_the_cache(model):
    engine = cached_engine(model, block_size=8, num_blocks=32)
    prompt = list(range(50, 90))  # 40 tokens: 5 full blocks
    first = run_to_completion(engine, [(0, prompt, 6)])
    engine.add_request(prompt, greedy(6), request_id="again")
    while engine.has_unfinished():
        engine.step()
    again = engine.output("again")
    assert again.token_ids == list(first.values())[0] == _reference(model, tuple(prompt), 6)
    assert again.num_cached_tokens == 32  # 5 blocks cached, the last one recomputed: the last token needs logits
    assert engine.prefix_cache_hit_rate == pytest.approx(32 / 80)
    admitted = next(s for s in engine.trace.steps if "again" in s.admitted)
    assert admitted.cache_hits == {"again": 32}
    kinds = [e[0] for e in admitted.kv_events]
    assert kinds.count("hit") == 4 and kinds.count("alloc") == 1  # 4 shared blocks, one fresh for the tail


def test_generated_tokens_are_cached_for_the_next_turn(model):
    engine = cached_engine(model, block_size=8, num_blocks=32)
    turn1 = list(range(60, 76))
    answer = run_to_completion(engine, [(0, turn1, 20)])
    turn2 = turn1 + list(answer.values())[0] + [33, 34, 35]  # the whole conversation so far, and a new line
    engine.add_request(turn2, greedy(4), request_id="turn2")
    while engine.has_unfinished():
        engine.step()
    out = engine.output("turn2")
    assert out.num_cached_tokens == 32  # 16 prompt + 16 of the 20 generated tokens (the last full block)
    assert out.token_ids == _reference(model, tuple(turn2), 4)


def test_seeded_sampling_is_identical_with_the_cache(model):
    params = [SamplingParams(temperature=0.9, top_p=0.9, max_new_tokens=8, seed=s, ignore_eos=True) for s in range(4)]
    prompts = [list(range(40, 72)) + [i] for i in range(4)]
    outs = {}
    for prefix_cache in (False, True):
        engine = cached_engine(model, block_size=8, num_blocks=40, prefix_cache=prefix_cache, max_num_seqs=2)
        ids = [engine.add_request(p, sp).request_id for p, sp in zip(prompts, params)]
        while engine.has_unfinished():
            engine.step()
        outs[prefix_cache] = [engine.output(i).token_ids for i in ids]
        if prefix_cache:
            assert engine.output(ids[-1]).num_cached_tokens == 32
    assert outs[False] == outs[True]


def test_a_preempted_request_finds_its_own_blocks_again(model):
    engine = cached_engine(model, block_size=8, num_blocks=9, max_num_seqs=3)
    prompts = [list(range(40, 64)), list(range(100, 124)), list(range(150, 174))]
    out = run_to_completion(engine, [(0, p, 20) for p in prompts])
    assert [out[i] for i in out] == [_reference(model, tuple(p), 20) for p in prompts]
    preempted = [rid for s in engine.trace.steps for rid in s.preempted]
    assert preempted, "the pool was meant to be too small for all three"
    back = [s.cache_hits.get(rid, 0) for s in engine.trace.steps for rid in s.admitted if rid in preempted]
    assert any(back), "a preempted request recomputed everything although its blocks were cached"


def test_prefix_cache_needs_the_paged_cache():
    with pytest.raises(ValueError, match="paged"):
        EngineConfig(prefix_cache=True)
    with pytest.raises(ValueError, match="prefix_cache"):
        EngineConfig(kv="paged", prefix_cache=1)


def test_without_the_cache_nothing_is_shared_or_recorded(model):
    engine = cached_engine(model, block_size=8, num_blocks=32, prefix_cache=False)
    prompt = list(range(50, 90))
    run_to_completion(engine, [(0, prompt, 3), (2, prompt, 3)])
    assert engine.prefix_cache_hit_rate is None
    assert all(not s.kv_events and not s.cache_hits for s in engine.trace.steps)


def test_trace_round_trip_keeps_the_cache_events(model):
    from minillm.trace import Trace

    engine = cached_engine(model, block_size=8, num_blocks=32)
    prompt = list(range(50, 90))
    run_to_completion(engine, [(0, prompt, 3), (4, prompt, 3)])
    again = Trace.from_dict(json.loads(json.dumps(engine.trace.to_dict())))  # through JSON: tuples become lists
    assert again.steps == engine.trace.steps
    assert any(s.kv_events for s in again.steps) and any(s.cache_hits for s in again.steps)
