"""n samples of one prompt: the block pool's fork and copy-on-write with exact block ids, and the
engine's n > 1 — each sample equals chapter 1's loop run with `params.for_sample(i)`, the prompt is
computed once, shared blocks are copied on first write, preemption / abort / early stops free
exactly what they should, and what cannot work is refused. `tests/conftest.py` checks after every
test that no slot or KV block leaked."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLM, LLMEngine
from minillm.generate import generate_with_cache
from minillm.kv.block_pool import BlockPool, OutOfBlocks
from minillm.sampling import SamplingParams
from minillm.scheduler.output import SchedulerOutput
from tests.hf_reference import ByteTokenizer, make_checkpoint
from tests.test_engine import paged_budget


def check_books(pool: BlockPool) -> None:
    """Every block's reference count is the number of tables holding it, and every block is exactly
    one of: held, free, cached-and-evictable."""
    held = Counter(b for table in pool.tables.values() for b in table)
    assert [held[b] for b in range(pool.num_blocks)] == pool.ref_counts, (pool.tables, pool.ref_counts)
    places = [b for b in range(pool.num_blocks) if pool.ref_counts[b]] + list(pool.free_queue) + list(pool.evictable)
    assert sorted(places) == list(range(pool.num_blocks))


# ---------------------------------------------------------------------------------------- block pool
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_fork_then_first_writers_copy_the_partial_block_and_the_last_writes_in_place(prefix_cache):
    pool = BlockPool(num_blocks=6, block_size=4, prefix_cache=prefix_cache)
    prompt = [10, 11, 12, 13, 14, 15]  # 6 tokens: a full block and a partial one
    assert pool.allocate("a", 6) == [0, 1]
    pool.cache_full_blocks("a", prompt, 6)
    pool.drain_events()
    assert pool.fork("a", "a#1") == [0, 1] and pool.fork("a", "a#2") == [0, 1]
    assert pool.ref_counts[:2] == [3, 3] and pool.num_free_blocks == 4
    check_books(pool)
    # each writes its first own token, position 6, in block index 1, shared three ways
    assert pool.can_write("a", 6, 7)
    assert pool.prepare_write("a", 6, 7) == [(1, 2)]  # a copy of block 1 into block 2
    assert pool.prepare_write("a#1", 6, 7) == [(1, 3)]
    assert pool.prepare_write("a#2", 6, 7) == []  # the last holder of block 1 writes in place
    assert pool.tables == {"a": [0, 2], "a#1": [0, 3], "a#2": [0, 1]}
    assert pool.ref_counts == [3, 1, 1, 1, 0, 0]
    assert pool.prepare_write("a", 7, 8) == []  # its own block now: no further copy
    check_books(pool)
    if prefix_cache:  # the pool's events say what happened (the trace shows them)
        events = pool.drain_events()
        assert [e for e in events if e[0] == "fork"] == [("fork", 0), ("fork", 1)] * 2
        assert [e for e in events if e[0] == "copy"] == [("copy", 1, 2), ("copy", 1, 3)]
    # freeing one sample leaves the others' blocks intact
    pool.free("a#1")
    assert pool.tables == {"a": [0, 2], "a#2": [0, 1]} and pool.ref_counts == [2, 1, 1, 0, 0, 0]
    assert 3 in pool.free_queue
    check_books(pool)
    pool.free("a")
    pool.free("a#2")
    assert pool.is_idle
    if prefix_cache:
        assert pool.cache.is_cached(0) and list(pool.evictable) == [0]  # the prompt's full block stays findable


def test_a_block_aligned_prompt_needs_no_copy():
    pool = BlockPool(num_blocks=8, block_size=4)
    assert pool.allocate("b", 8) == [0, 1]
    pool.fork("b", "b#1")
    assert pool.prepare_write("b", 8, 9) == [] and pool.prepare_write("b#1", 8, 9) == []
    assert pool.tables == {"b": [0, 1, 2], "b#1": [0, 1, 3]} and pool.ref_counts[:4] == [2, 2, 1, 1]
    check_books(pool)
    pool.free("b#1")
    pool.free("b")
    assert pool.is_idle


def test_a_write_spanning_a_shared_block_and_a_new_one_takes_both():
    pool = BlockPool(num_blocks=4, block_size=4)
    pool.allocate("a", 6)
    pool.fork("a", "a#1")
    assert pool.can_write("a", 6, 9)  # one copy + one new block, two free
    assert pool.prepare_write("a", 6, 9) == [(1, 3)]  # grows first (block 2), then copies block 1 into 3
    assert pool.tables == {"a": [0, 3, 2], "a#1": [0, 1]} and pool.num_free_blocks == 0
    check_books(pool)
    pool.free("a")
    pool.free("a#1")
    assert pool.is_idle


def test_no_free_block_for_the_copy_is_out_of_blocks_and_changes_nothing():
    pool = BlockPool(num_blocks=2, block_size=4)
    pool.allocate("a", 6)
    pool.fork("a", "a#1")
    assert not pool.can_write("a", 6, 7)
    with pytest.raises(OutOfBlocks):
        pool.prepare_write("a", 6, 7)
    assert pool.tables == {"a": [0, 1], "a#1": [0, 1]} and pool.ref_counts == [2, 2]
    assert pool.can_write("a", 2, 3) is False  # block 0 is shared too
    pool.free("a#1")  # the other holder leaves: in place, no block needed
    assert pool.can_write("a", 6, 7) and pool.prepare_write("a", 6, 7) == []
    pool.free("a")
    assert pool.is_idle
    # a shared block plus a new one, one block free: refused as a whole
    pool = BlockPool(num_blocks=3, block_size=4)
    pool.allocate("a", 6)
    pool.fork("a", "a#1")
    assert pool.can_write("a", 6, 7) and not pool.can_write("a", 6, 9)
    with pytest.raises(OutOfBlocks):
        pool.prepare_write("a", 6, 9)
    assert pool.tables == {"a": [0, 1], "a#1": [0, 1]} and pool.num_free_blocks == 1
    pool.free("a")
    pool.free("a#1")
    assert pool.is_idle


def test_fork_misuse_is_refused():
    pool = BlockPool(num_blocks=4, block_size=4)
    pool.allocate("a", 3)
    pool.fork("a", "a#1")
    with pytest.raises(ValueError, match="already has a block table"):
        pool.fork("a", "a#1")
    with pytest.raises(ValueError, match="holds no blocks"):
        pool.fork("nobody", "x")
    pool.free("a")
    pool.free("a#1")
    assert pool.is_idle


def test_a_fork_of_a_fork_and_the_prefix_cache_chains():
    pool = BlockPool(num_blocks=8, block_size=2, prefix_cache=True)
    tokens = [3, 4, 5, 6, 7]
    pool.allocate("a", 5)
    pool.cache_full_blocks("a", tokens, 5)
    pool.fork("a", "a#1")
    pool.fork("a#1", "a#2")
    assert pool.ref_counts[:3] == [3, 3, 3]
    assert pool.prepare_write("a#2", 5, 6) == [(2, 3)]
    pool.cache_full_blocks("a#2", tokens + [9], 6)  # its copy, now full, is cached with a#2's contents
    assert pool.cache.is_cached(3) and not pool.cache.is_cached(2)
    for request_id in ("a#2", "a#1", "a"):
        pool.free(request_id)
        check_books(pool)
    assert pool.is_idle


# ---------------------------------------------------------------------------------------- engine helpers
@pytest.fixture(scope="module")
def same_draft_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("same-draft")
    make_checkpoint("qwen3", folder, seed=3)  # the `model` fixture's weights: its guesses are accepted
    return str(folder)


def engine_for(model, kind: str, max_num_seqs: int = 8, num_blocks: int = 96, block_size: int = 4,
               draft: str | None = None, **overrides) -> LLMEngine:
    settings: dict = {"max_num_seqs": max_num_seqs, "max_model_len": 96}
    if kind != "contiguous":
        budget = paged_budget(model, block_size, num_blocks, draft if "draft" in kind else None)
        settings |= {"kv": "paged", "block_size": block_size, "kv_cache_bytes": budget}
    if "prefix" in kind:
        settings["prefix_cache"] = True
    if "chunked" in kind:
        settings |= {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 3}
    if "ngram" in kind:
        settings["speculative"] = SpeculativeConfig("ngram", 3)
    if "draft" in kind:
        settings["speculative"] = SpeculativeConfig("draft", 3, draft)
    return LLMEngine(model, ByteTokenizer(), EngineConfig(**(settings | overrides)))


def capture(engine: LLMEngine) -> list[SchedulerOutput]:
    """Every SchedulerOutput the engine runs from now on."""
    outputs: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        outputs.append(schedule())
        return outputs[-1]

    engine.scheduler.schedule = recording
    return outputs


def run(engine: LLMEngine, prompts, params, check_every_step: bool = True) -> list:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp).request_id for p, sp in zip(prompts, params)]
    while engine.has_unfinished():
        engine.step()
        if check_every_step and engine.pool is not None:
            check_books(engine.pool)
    return [engine.output(i) for i in ids]


def naive(model, prompt, params: SamplingParams) -> list[list[int]]:
    """Chapter 1's loop once per sample."""
    return [generate_with_cache(model, ByteTokenizer(), prompt, params.for_sample(i)).token_ids
            for i in range(params.n)]


PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 43, 44, 45, 46, 47], [5, 6, 7, 8, 9, 10, 11, 90, 91, 92, 93]]
KINDS = ["contiguous", "paged", "paged-prefix", "paged-chunked", "paged-prefix-chunked", "contiguous-chunked",
         "paged-ngram", "contiguous-ngram", "paged-prefix-draft"]


# ---------------------------------------------------------------------------------------- n > 1 in the engine
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_n3_gives_three_equal_outputs_equal_to_the_naive_loop(model, same_draft_folder, kind):
    engine = engine_for(model, kind, draft=same_draft_folder)
    params = SamplingParams(n=3, temperature=0, max_new_tokens=10, ignore_eos=True)
    outputs = run(engine, PROMPTS, params)
    for prompt, out in zip(PROMPTS, outputs):
        expected = naive(model, prompt, dataclasses.replace(params, n=1))[0]
        assert [o.index for o in out.outputs] == [0, 1, 2]
        assert [o.token_ids for o in out.outputs] == [expected] * 3
        assert [o.finish_reason for o in out.outputs] == ["length"] * 3
        assert out.token_ids == expected and out.text == ByteTokenizer().decode(expected)


@pytest.mark.parametrize("kind", [k for k in KINDS if "ngram" not in k and "draft" not in k])
def test_seeded_n3_sample_i_is_the_naive_loop_with_for_sample_i_and_reproducible(model, kind):
    params = [SamplingParams(n=3, temperature=0.9, seed=7, max_new_tokens=10, ignore_eos=True),
              SamplingParams(n=2, temperature=1.2, top_k=30, seed=123, max_new_tokens=8, ignore_eos=True,
                             presence_penalty=0.5),
              SamplingParams(temperature=0.8, seed=7, max_new_tokens=9, ignore_eos=True)]
    first = run(engine_for(model, kind), PROMPTS, params)
    second = run(engine_for(model, kind), PROMPTS, params)
    for prompt, p, a, b in zip(PROMPTS, params, first, second):
        expected = naive(model, prompt, p)
        assert [o.token_ids for o in a.outputs] == expected
        assert [o.token_ids for o in b.outputs] == expected
    assert first[0].outputs[0].token_ids != first[0].outputs[1].token_ids  # samples really differ


@pytest.mark.parametrize("kind", ["contiguous", "paged", "paged-prefix", "paged-chunked"])
def test_the_prompt_is_computed_once_and_shared_blocks_are_copied_on_first_write(model, kind):
    engine = engine_for(model, kind)
    outputs_seen = capture(engine)
    prompt = PROMPTS[0]  # 6 tokens, block_size 4: the samples share a partial block
    (out,) = run(engine, [prompt], SamplingParams(n=3, temperature=1.0, seed=1, max_new_tokens=6, ignore_eos=True))
    parent, children = out.request_id, [f"{out.request_id}#1", f"{out.request_id}#2"]
    chunks = [c for o in outputs_seen for c in o.chunks]
    assert sum(c.num_tokens for c in chunks if c.request_id == parent and c.is_prefill) == len(prompt)
    assert all(not c.is_prefill and c.start >= len(prompt) for c in chunks if c.request_id in children)
    assert sum(s.prefill_tokens.get(parent, 0) for s in engine.trace.steps) == len(prompt)
    assert all(child not in s.prefill_tokens for s in engine.trace.steps for child in children)
    forking = [c for c in chunks if c.forks]
    assert len(forking) == 1 and forking[0].request_id == parent and set(forking[0].forks) == set(children)
    if kind == "contiguous":
        copies = [c for o in outputs_seen for c in o.slot_copies]
        assert sorted(copies) == sorted((0, slot, len(prompt)) for slot in (1, 2))  # the prompt into each slot
        assert not any(o.block_copies for o in outputs_seen)
    else:
        copies = [c for o in outputs_seen for c in o.block_copies]
        assert len(copies) == 2  # three holders of the partial block: two copies, the last writes in place
        assert len({src for src, _ in copies}) == 1 and len({dst for _, dst in copies}) == 2
        assert not any(o.slot_copies for o in outputs_seen)
    if kind == "paged-prefix":  # the trace shows the pool's events
        events = [e for s in engine.trace.steps for e in s.kv_events]
        assert sum(e[0] == "copy" for e in events) == 2 and sum(e[0] == "fork" for e in events) == 2 * 2


def test_a_block_aligned_prompt_forks_without_copies(model):
    engine = engine_for(model, "paged", block_size=4)
    outputs_seen = capture(engine)
    run(engine, [PROMPTS[1]], SamplingParams(n=3, temperature=1.0, seed=2, max_new_tokens=5, ignore_eos=True))
    assert not any(o.block_copies for o in outputs_seen)


def test_prompt_logprobs_once_and_per_sample_logprobs_equal_the_naive_loops(model):
    engine = engine_for(model, "paged-prefix")
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_new_tokens=6, ignore_eos=True, logprobs=2,
                            prompt_logprobs=1)
    (out,) = run(engine, [PROMPTS[2]], params)
    assert len(out.prompt_logprobs) == len(PROMPTS[2]) and out.prompt_logprobs[0] is None
    for i, sample in enumerate(out.outputs):
        loop = generate_with_cache(model, ByteTokenizer(), PROMPTS[2], params.for_sample(i))
        assert sample.token_ids == loop.token_ids and len(sample.logprobs) == len(sample.token_ids)
        for ours, theirs in zip(sample.logprobs, loop.logprobs):
            assert ours.token_id == theirs.token_id and ours.logprob == pytest.approx(theirs.logprob, abs=1e-5)
        for ours, theirs in zip(out.prompt_logprobs[1:], loop.prompt_logprobs[1:]):
            assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-5)


@pytest.mark.parametrize("kind", ["paged", "paged-prefix", "paged-chunked"])
def test_preempted_samples_come_back_with_the_same_tokens(model, kind):
    prompts = [PROMPTS[0], PROMPTS[2]]
    params = [SamplingParams(n=3, temperature=0.9, seed=11, max_new_tokens=14, ignore_eos=True),
              SamplingParams(temperature=0, max_new_tokens=14, ignore_eos=True)]
    engine = engine_for(model, kind, num_blocks=10, max_tokens_per_step=64)
    outputs_seen = capture(engine)
    outputs = run(engine, prompts, params)
    preempted = [rid for o in outputs_seen for rid in o.preempted_ids]
    assert any("#" in rid for rid in preempted), f"a forked sample should have been preempted: {preempted}"
    for prompt, p, out in zip(prompts, params, outputs):
        assert [o.token_ids for o in out.outputs] == naive(model, prompt, p)
    if "prefix" in kind:  # a preempted sample's return is no prefix sharing
        cache = engine.pool.cache
        assert cache.readmitted_queried_tokens > 0


@pytest.mark.parametrize("kind", ["contiguous", "paged", "paged-prefix", "paged-ngram"])
@pytest.mark.parametrize("abort_after", [0, 1, 4])
def test_aborting_a_request_ends_every_sample_and_leaves_the_others_unchanged(model, kind, abort_after):
    engine = engine_for(model, kind, num_blocks=40)
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    many = SamplingParams(n=3, temperature=0.9, seed=3, max_new_tokens=12, ignore_eos=True)
    ids = [engine.add_request(PROMPTS[0], greedy).request_id, engine.add_request(PROMPTS[2], many).request_id,
           engine.add_request(PROMPTS[1], greedy).request_id]
    for _ in range(abort_after):
        engine.step()
    assert not engine.abort(f"{ids[1]}#1")  # a sample alone cannot be aborted: its request can
    assert engine.abort(ids[1])
    assert not engine.abort(ids[1])
    while engine.has_unfinished():
        engine.step()
        if engine.pool is not None:
            check_books(engine.pool)
    aborted = engine.output(ids[1])
    expected = naive(model, PROMPTS[2], many)
    assert [o.finish_reason for o in aborted.outputs] == ["abort"] * 3
    for sample, full in zip(aborted.outputs, expected):
        assert sample.token_ids == full[: len(sample.token_ids)] and len(sample.token_ids) < 12
    assert engine.output(ids[0]).token_ids == naive(model, PROMPTS[0], greedy)[0]
    assert engine.output(ids[2]).token_ids == naive(model, PROMPTS[1], greedy)[0]


def test_a_sample_that_stops_early_frees_only_its_own_blocks(model):
    base = SamplingParams(n=3, temperature=1.0, seed=21, max_new_tokens=16, ignore_eos=True)
    prompt = PROMPTS[2]
    free_run = naive(model, prompt, base)
    # a stop token that ends one sample early and the others later (or never)
    choice = None
    for token in {t for run_ in free_run for t in run_[1:6]}:
        firsts = [run_.index(token) if token in run_ else 99 for run_ in free_run]
        if len(set(firsts)) == 3 and min(firsts) >= 1:
            choice = token, firsts
            break
    assert choice is not None
    token, firsts = choice
    params = dataclasses.replace(base, stop_token_ids=(token,))
    expected = naive(model, prompt, params)
    assert [len(e) for e in expected] == [min(f + 1, 16) for f in firsts]
    engine = engine_for(model, "paged", block_size=4)
    request = engine.add_request(prompt, params)
    samples = request.samples
    engine.step()  # admitted, prompt computed, samples forked
    shared = engine.pool.block_table(request.request_id)[0]  # the prompt's first block, shared by every sample
    assert all(engine.pool.block_table(s.request_id)[0] == shared for s in samples)
    while engine.has_unfinished():
        engine.step()
        check_books(engine.pool)
        live = [s for s in samples if not s.status.is_done]
        for s in samples:
            assert (s.request_id in engine.pool.tables) == (not s.status.is_done and s.num_computed_tokens > 0)
        if live and all(s.num_computed_tokens for s in samples):
            assert engine.pool.ref_counts[shared] == len(live)
    out = engine.output(request.request_id)
    assert [o.token_ids for o in out.outputs] == expected
    assert [o.finish_reason for o in out.outputs] == ["stop" if f + 1 < 16 else "length" for f in firsts]


def test_eos_ends_each_sample_on_its_own(model):
    """A bias towards EOS makes the seeded samples end at different lengths; each ends at its own
    EOS (not before min_tokens), the others carry on."""
    params = SamplingParams(n=3, temperature=1.0, seed=4, max_new_tokens=16, min_tokens=2, logit_bias={2: 6.0})
    expected = naive(model, PROMPTS[0], params)
    assert len({len(e) for e in expected}) > 1 and any(e[-1] == 2 for e in expected)
    engine = engine_for(model, "paged")
    (out,) = run(engine, [PROMPTS[0]], params)
    assert [o.token_ids for o in out.outputs] == expected
    assert [o.finish_reason for o in out.outputs] == ["stop" if e[-1] == 2 else "length" for e in expected]
    assert all(len(e) > 2 for e in expected)


def test_llm_generate_with_n_samples(model):
    llm = LLM.__new__(LLM)
    llm.engine = engine_for(model, "paged-prefix")
    params = [SamplingParams(n=3, temperature=1.0, seed=9, max_new_tokens=5, ignore_eos=True),
              SamplingParams(n=2, temperature=0, max_new_tokens=5, ignore_eos=True)]
    outputs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for prompt, p, out in zip(PROMPTS, params, outputs):
        assert [o.token_ids for o in out.outputs] == naive(model, prompt, p)
    assert not llm.engine.requests  # every sample released


# ---------------------------------------------------------------------------------------- refusals
def test_what_cannot_work_is_refused_with_a_clear_error(model):
    engine = engine_for(model, "paged", max_num_seqs=3)
    with pytest.raises(ValueError, match=r"n=4 .*max_num_seqs is 3"):
        engine.add_request([5, 6], SamplingParams(n=4))
    static = LLMEngine(model, ByteTokenizer(), EngineConfig(batching="static", max_num_seqs=4, max_model_len=64))
    with pytest.raises(ValueError, match="continuous batching"):
        static.add_request([5, 6], SamplingParams(n=2))
    assert not engine.has_unfinished() and not static.has_unfinished()


def test_request_ids_colliding_with_sample_ids_are_refused(model):
    engine = engine_for(model, "paged", max_num_seqs=8)
    greedy = SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True)
    engine.add_request([5, 6], SamplingParams(n=3, temperature=0, max_new_tokens=3), request_id="a")
    with pytest.raises(ValueError, match="in use"):
        engine.add_request([5, 6], greedy, request_id="a#1")  # a sample of a live request
    with pytest.raises(ValueError, match="in use"):
        engine.add_request([5, 6], greedy, request_id="a#2")
    engine.add_request([7], greedy, request_id="b#1")
    with pytest.raises(ValueError, match="in use"):
        engine.add_request([5, 6], SamplingParams(n=2), request_id="b")  # its sample's id is taken
    engine.add_request([5, 6], SamplingParams(n=1, max_new_tokens=2), request_id="b")  # n=1 has no sample ids
    while engine.has_unfinished():
        engine.step()
    with pytest.raises(ValueError, match="in use"):
        engine.add_request([5, 6], greedy, request_id="a#1")  # finished but not released: still a's sample
    assert [o.finish_reason for o in engine.output("a").outputs] == ["length"] * 3
    engine.release("a")
    assert "a#1" not in engine.requests and "a" not in engine.requests
    engine.add_request([5, 6], greedy, request_id="a#1")  # released: free again
    while engine.has_unfinished():
        engine.step()


def test_prompt_logprobs_are_computed_once_even_when_samples_are_preempted(model):
    engine = engine_for(model, "paged-prefix", num_blocks=8, max_tokens_per_step=64)
    computed: Counter = Counter()
    prompt_rows = engine.runner._prompt_rows

    def counting(chunks):
        rows = prompt_rows(chunks)
        computed.update(r.request_id for r in rows)
        return rows

    engine.runner._prompt_rows = counting
    outputs_seen = capture(engine)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    params = SamplingParams(n=3, temperature=0.9, seed=7, max_new_tokens=14, ignore_eos=True, prompt_logprobs=2)
    outputs = run(engine, prompts, params)
    assert any("#" in rid for o in outputs_seen for rid in o.preempted_ids)  # samples were preempted
    for prompt, out in zip(prompts, outputs):
        assert [o.token_ids for o in out.outputs] == naive(model, prompt, params)
        assert len(out.prompt_logprobs) == len(prompt)
    assert computed == Counter({out.request_id: len(prompt) - 1 for prompt, out in zip(prompts, outputs)})


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("kind", ["contiguous-chunked", "paged-chunked"])
def test_samples_fork_right_when_the_last_prompt_chunk_gets_guesses(model, same_draft_folder, method, kind):
    # a 5-token prompt in chunks of 4: its last chunk is its last token alone, which the proposer guesses after
    engine = engine_for(model, f"{kind}-{method}", draft=same_draft_folder, max_tokens_per_prefill_chunk=4)
    params = SamplingParams(n=2, temperature=0, max_new_tokens=4, ignore_eos=True)
    request = engine.add_request([5, 5, 5, 5, 5], params)
    try:
        while engine.has_unfinished():
            engine.step()
        out = engine.output(request.request_id)
        expected = naive(model, [5, 5, 5, 5, 5], dataclasses.replace(params, n=1))[0]
        assert engine.is_done(request.request_id)
        assert sorted(engine.scheduler.free_slots) == list(range(engine.config.max_num_seqs))
        assert [o.token_ids for o in out.outputs] == [expected, expected]
    finally:  # (so that the leak, if any, fails this test rather than conftest's check after it)
        engine.abort(request.request_id)
