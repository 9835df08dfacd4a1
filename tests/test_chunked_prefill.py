"""Chunked prefill (chapter 6): prompts computed over several steps give exactly the tokens of an
unchunked engine and of chapter 1's naive loop — on both caches, with the prefix cache, under
preemption — and the scheduler fills each step decodes first."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.request import Request
from minillm.sampling import SamplingParams
from minillm.scheduler import ContinuousScheduler
from tests.hf_reference import ByteTokenizer
from tests.test_engine import _reference, paged_budget

SHARED = list(range(40, 80))  # a prefix some prompts share (prefix cache runs)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def make_engine(model, kind: str, chunk: int | None, block_size: int = 8, num_blocks: int = 64,
                **overrides) -> LLMEngine:
    """kind: "contiguous", "paged" or "prefix" (paged with a prefix cache); chunk None = unchunked."""
    settings = {"max_num_seqs": 4, "max_model_len": 96, "max_tokens_per_step": 256} | overrides
    if chunk is not None:
        settings |= {"chunked_prefill": True, "max_tokens_per_prefill_chunk": chunk}
    if kind != "contiguous":
        settings |= {"kv": "paged", "block_size": block_size, "prefix_cache": kind == "prefix",
                     "kv_cache_bytes": paged_budget(model, block_size, num_blocks)}
    return LLMEngine(model, ByteTokenizer(), EngineConfig(**settings))


def serve(engine: LLMEngine, arrivals: list[tuple[int, list[int], SamplingParams]]) -> list[list[int]]:
    """arrivals: (steps to run before it arrives, prompt, params). Returns each request's tokens."""
    ids = []
    for wait, prompt, params in arrivals:
        for _ in range(wait):
            if engine.has_unfinished():
                engine.step()
        ids.append(engine.add_request(prompt, params).request_id)
    while engine.has_unfinished():
        engine.step()
    return [engine.output(i).token_ids for i in ids]


arrivals_strategy = st.lists(st.tuples(st.integers(0, 4),  # steps before it arrives
                                       st.integers(0, 40),  # how much of the shared prefix it starts with
                                       st.lists(st.integers(3, 255), max_size=30),  # its own tail
                                       st.integers(1, 8),  # new tokens
                                       st.booleans()),  # sampled with a seed instead of greedy
                             min_size=1, max_size=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=arrivals_strategy, kind=st.sampled_from(["contiguous", "paged", "prefix"]),
       block_size=st.sampled_from([8, 16]), chunk_choice=st.sampled_from(["1", "3", "16", "64", "bs-1", "bs+1"]),
       spare_blocks=st.integers(0, 6), budget=st.integers(8, 80))
def test_chunked_runs_give_the_unchunked_and_the_naive_loops_tokens(model, arrivals, kind, block_size, chunk_choice,
                                                                    spare_blocks, budget):
    chunk = {"bs-1": block_size - 1, "bs+1": block_size + 1}.get(chunk_choice) or int(chunk_choice)
    requests = [(wait, (SHARED[:cut] + tail) or [5],
                 SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_new_tokens=n, ignore_eos=True) if sampled
                 else greedy(n)) for i, (wait, cut, tail, n, sampled) in enumerate(arrivals)]
    longest = max(len(prompt) + p.max_new_tokens for _, prompt, p in requests)
    num_blocks = -(-longest // block_size) + spare_blocks  # small: requests get preempted and come back
    unchunked = serve(make_engine(model, kind, None, block_size, num_blocks), requests)
    chunked_engine = make_engine(model, kind, chunk, block_size, num_blocks, max_tokens_per_step=budget)
    chunked = serve(chunked_engine, requests)
    assert chunked == unchunked  # seeded sampling too: a chunk that samples nothing draws nothing
    for (_, prompt, params), tokens in zip(requests, chunked):
        if params.greedy:
            assert tokens == _reference(model, tuple(prompt), params.max_new_tokens)
    for record in chunked_engine.trace.steps:  # no step over the budget, no chunk over its limit
        assert record.num_tokens <= budget
        assert all(s.num_tokens <= chunk for s in record.slots if s is not None and s.phase == "prefill")


def test_a_prompt_longer_than_the_step_budget_is_served_in_chunks(model):
    engine = make_engine(model, "paged", chunk=16, max_tokens_per_step=24)
    long_prompt = list(range(10, 90))  # 80 tokens, more than the step's 24
    tokens = serve(engine, [(0, [7, 8, 9], greedy(12)), (2, long_prompt, greedy(4))])
    assert tokens[1] == _reference(model, tuple(long_prompt), 4)
    prefill_steps = [s for s in engine.trace.steps
                     if any(x is not None and x.request_id == "1" and x.phase == "prefill" for x in s.slots)]
    assert len(prefill_steps) == 5  # 80 tokens in chunks of 16
    unchunked = make_engine(model, "paged", chunk=None, max_tokens_per_step=24)
    with pytest.raises(ValueError, match="chunked_prefill=True would serve it in chunks"):
        unchunked.add_request(long_prompt, greedy(4))
    # a prompt that fits but may grow past the budget: a preemption would recompute it in one step
    with pytest.raises(ValueError, match="after a preemption it could not be recomputed"):
        unchunked.add_request(list(range(10, 30)), greedy(10))
    engine.add_request(list(range(10, 30)), greedy(10), request_id="grows")  # chunked: recomputed in chunks
    while engine.has_unfinished():
        engine.step()
    assert engine.output("grows").token_ids == _reference(model, tuple(range(10, 30)), 10)


def test_decoding_requests_run_in_every_step_while_a_long_prompt_is_chunked(model):
    """Stall-free: once a request decodes, every step runs its token until it finishes — the long
    prompt that arrives meanwhile only takes what the budget leaves."""
    engine = make_engine(model, "contiguous", chunk=8, max_tokens_per_step=10)
    serve(engine, [(0, [5, 6, 7], greedy(20)), (0, [8, 9], greedy(20)), (3, list(range(20, 80)), greedy(2))])
    for rid in ("0", "1"):
        decoding = False
        for record in engine.trace.steps:
            mine = next((s for s in record.slots if s is not None and s.request_id == rid), None)
            if mine is None:
                break  # finished
            if decoding:
                assert mine.phase == "decode" and mine.num_tokens == 1, f"request {rid} stalled in {record}"
            decoding = decoding or mine.phase == "decode"
    chunks = [s.num_tokens for r in engine.trace.steps for s in r.slots
              if s is not None and s.request_id == "2" and s.phase == "prefill"]
    assert sum(chunks) == 60 and max(chunks) == 8 and min(chunks) > 0
    assert chunks[:7] == [8] * 7 and chunks[7] == 4  # full chunks while the two decodes take 2 of the 10


def test_a_prompt_longer_than_max_model_len_is_refused_and_the_others_keep_running(model):
    engine = make_engine(model, "paged", chunk=16, max_model_len=64)
    first = engine.add_request([5, 6, 7], greedy(6))
    engine.step()
    with pytest.raises(ValueError, match="prompt has 77 tokens; the context holds 64"):
        engine.add_request(list(range(3, 80)), greedy(2))
    while engine.has_unfinished():
        engine.step()
    assert engine.output(first.request_id).token_ids == _reference(model, (5, 6, 7), 6)


def test_a_partly_cached_prompt_continues_in_chunks_from_its_hit(model):
    engine = make_engine(model, "prefix", chunk=5, block_size=8)
    serve(engine, [(0, SHARED[:32] + [3], greedy(2))])
    engine.add_request(SHARED[:32] + [9, 9, 9, 9, 9, 9, 9], greedy(3), request_id="again")
    while engine.has_unfinished():
        engine.step()
    out = engine.output("again")
    assert out.num_cached_tokens == 32
    assert out.token_ids == _reference(model, tuple(SHARED[:32] + [9] * 7), 3)
    chunks = [(s.num_tokens, r.kv_tokens.get("again")) for r in engine.trace.steps for s in r.slots
              if s is not None and s.request_id == "again" and s.phase == "prefill"]
    assert [n for n, _ in chunks] == [5, 2]  # 7 uncached tokens: a chunk of 5, then 2
    assert chunks[0][1] == 37  # computed after the first chunk: the 32 found + 5


def test_the_step_is_filled_decodes_first_then_prefills_in_progress_then_newcomers():
    scheduler = ContinuousScheduler(max_num_seqs=4, max_model_len=100, max_tokens_per_step=12, max_prefill_chunk=8)
    old_prefill = Request("old", list(range(30)), greedy(1), 0.0)
    decode_a, decode_b = Request("a", [1, 2], greedy(4), 0.0), Request("b", [1, 2], greedy(4), 0.0)
    newcomer = Request("new", list(range(20)), greedy(1), 0.0)
    for request in (old_prefill, decode_a, decode_b):
        scheduler.add(request)
    first = scheduler.schedule()  # admits all three: "old" gets a chunk of 8, a and b their 2-token prompts
    assert {c.request_id: c.num_tokens for c in first.chunks} == {"old": 8, "a": 2, "b": 2}
    scheduler.update(first, {"a": [3], "b": [3]})  # a and b sampled their first token; "old" sampled nothing
    scheduler.add(newcomer)
    out = scheduler.schedule()
    granted = {c.request_id: c.num_tokens for c in out.chunks}
    assert granted == {"a": 1, "b": 1, "old": 8, "new": 2}  # 12 tokens: decodes, a whole chunk, what is left
    assert [c.request_id for c in out.chunks] == ["a", "b", "old", "new"]
    assert not any(c.samples for c in out.chunks if c.is_prefill)  # neither prefill reaches its end


@pytest.mark.parametrize("bad, match", [({"chunked_prefill": 1}, "chunked_prefill must be True or False"),
                                        ({"chunked_prefill": True, "batching": "static"}, "needs batching"),
                                        ({"max_tokens_per_prefill_chunk": 0}, "max_tokens_per_prefill_chunk")])
def test_bad_chunking_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**bad)


def test_numpy_bools_are_accepted_as_plain_bools():
    config = EngineConfig(chunked_prefill=np.bool_(True), kv="paged", prefix_cache=np.bool_(False),
                          use_triton=np.bool_(False))
    assert (config.chunked_prefill, config.prefix_cache, config.use_triton) == (True, False, False)
    assert all(type(v) is bool for v in (config.chunked_prefill, config.prefix_cache, config.use_triton))
    with pytest.raises(ValueError, match="use_triton must be None, True or False"):
        EngineConfig(use_triton="no")


def test_chunks_survive_forced_preemption_and_come_back_in_chunks(model):
    """A pool too small for everyone: requests are preempted mid-decode (and mid-prefill) and recompute
    their tokens in chunks when they return."""
    engine = make_engine(model, "paged", chunk=5, block_size=8, num_blocks=9, max_tokens_per_step=12)
    prompts = [list(range(10, 40)), list(range(50, 75)), list(range(80, 100))]
    tokens = serve(engine, [(0, p, greedy(14)) for p in prompts])
    assert tokens == [_reference(model, tuple(p), 14) for p in prompts]
    assert any(record.preempted for record in engine.trace.steps), "the pool was meant to force a preemption"
    assert all(s.num_tokens <= 5 for r in engine.trace.steps for s in r.slots if s is not None and s.phase == "prefill")
