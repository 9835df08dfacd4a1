"""The acceptance test of the batched sampler and of n samples: any mix of sampling settings —
n (1-3), penalties, logit bias, min_tokens, stop tokens, min-p, top-k / top-p, greedy or seeded
temperatures — batched together through `LLM.generate` on any cache configuration (contiguous or
paged, prefix cache and chunked prefill on or off, a KV budget tight enough to preempt) gives every
sample exactly the tokens (and the text: stop strings too) of chapter 1's loop run with
`params.for_sample(i)`; and after every run the block pool is idle (every reference count back to
zero, every copied block freed)."""

from __future__ import annotations

import functools
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig
from minillm.engine import LLM, LLMEngine
from minillm.generate import generate_with_cache
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from tests.test_engine import paged_budget

MAX_MODEL_LEN = 64


@functools.cache
def _naive(model, prompt: tuple[int, ...], params: SamplingParams) -> tuple[tuple[int, ...], str]:
    out = generate_with_cache(model, ByteTokenizer(), list(prompt), params)
    return tuple(out.token_ids), out.text


def expected_samples(model, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    return [list(_naive(model, tuple(prompt), params.for_sample(i))[0]) for i in range(params.n)]


def expected_texts(model, prompt: list[int], params: SamplingParams) -> list[str]:
    return [_naive(model, tuple(prompt), params.for_sample(i))[1] for i in range(params.n)]


@st.composite
def sampling_params(draw) -> SamplingParams:
    max_new_tokens = draw(st.integers(1, 12))
    greedy = draw(st.booleans())
    likely = [2, 5, 6, 7, 40, 41, 100]  # EOS and tokens the prompts below are made of: penalties and stops bite
    return SamplingParams(
        n=draw(st.integers(1, 3)),
        temperature=0.0 if greedy else draw(st.sampled_from([0.5, 1.0, 1.7])),
        seed=None if greedy else draw(st.integers(0, 2**64 - 1)),
        top_k=draw(st.one_of(st.none(), st.integers(1, 60))),
        top_p=draw(st.sampled_from([1.0, 0.9, 0.6])),
        min_p=draw(st.sampled_from([0.0, 0.05, 0.3])),
        presence_penalty=draw(st.sampled_from([0.0, 1.0, -0.5])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.7, -1.0])),
        repetition_penalty=draw(st.sampled_from([1.0, 1.3, 0.8])),
        logit_bias=draw(st.dictionaries(st.sampled_from(likely), st.sampled_from([-100.0, -3.0, 2.5, 8.0]),
                                        max_size=3)),
        min_tokens=draw(st.integers(0, min(3, max_new_tokens))),
        stop_token_ids=tuple(draw(st.lists(st.sampled_from(likely), max_size=2))),
        stop=tuple(draw(st.lists(st.sampled_from(["(", ")", "d", "()", ")(", "\x05\x06"]), max_size=2))),
        include_stop_str_in_output=draw(st.booleans()),
        logprobs=draw(st.sampled_from([None, 0, 3])),  # asking for logprobs changes no token
        prompt_logprobs=draw(st.sampled_from([None, None, 1])),  # nor does this (it only skips prefix-cache hits)
        ignore_eos=draw(st.booleans()),
        max_new_tokens=max_new_tokens,
    )


requests_strategy = st.lists(
    st.tuples(st.lists(st.sampled_from([5, 6, 7, 40, 41, 100, 3, 200, 255, 17]), min_size=1, max_size=20),
              sampling_params()),
    min_size=1, max_size=4)

KINDS = ["contiguous", "contiguous-chunked", "paged", "paged-prefix", "paged-chunked", "paged-prefix-chunked"]


def make_engine(model, kind: str, requests, block_size: int, spare_blocks: int, max_num_seqs: int) -> LLMEngine:
    longest = max(len(p) + sp.max_new_tokens for p, sp in requests)
    most_samples = max(sp.n for _, sp in requests)
    settings: dict = {"max_num_seqs": max(max_num_seqs, most_samples), "max_model_len": MAX_MODEL_LEN,
                      "max_tokens_per_step": 64}
    if "chunked" in kind:
        settings |= {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 4, "max_tokens_per_step": 8}
    if kind.startswith("paged"):  # the longest request fits, plus a few blocks: samples compete and get preempted
        num_blocks = -(-longest // block_size) + spare_blocks
        settings |= {"kv": "paged", "block_size": block_size, "prefix_cache": "prefix" in kind,
                     "kv_cache_bytes": paged_budget(model, block_size, num_blocks)}
    return LLMEngine(model, ByteTokenizer(), EngineConfig(**settings))


def assert_idle(engine: LLMEngine) -> None:
    assert not engine.has_unfinished() and not engine.requests
    assert sorted(engine.scheduler.free_slots) == list(range(engine.config.max_num_seqs))
    pool = engine.pool
    if pool is not None:
        assert pool.is_idle, (pool.tables, pool.ref_counts)
        assert not any(pool.ref_counts) and not pool.tables
        assert Counter(list(pool.free_queue) + list(pool.evictable)) == Counter(range(pool.num_blocks))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(requests=requests_strategy, kind=st.sampled_from(KINDS), block_size=st.sampled_from([4, 8]),
       spare_blocks=st.integers(0, 6), max_num_seqs=st.integers(1, 6))
def test_every_sample_of_every_mix_equals_the_naive_loop(model, requests, kind, block_size, spare_blocks,
                                                         max_num_seqs):
    llm = LLM.__new__(LLM)  # LLM() would load a checkpoint: wrap the engine around the tiny model
    llm.engine = make_engine(model, kind, requests, block_size, spare_blocks, max_num_seqs)
    outputs = llm.generate([p for p, _ in requests], [sp for _, sp in requests], use_tqdm=False)
    for (prompt, params), out in zip(requests, outputs):
        assert out.error is None, out.error
        assert [o.index for o in out.outputs] == list(range(params.n))
        assert [o.token_ids for o in out.outputs] == expected_samples(model, prompt, params), (kind, params)
        assert [o.text for o in out.outputs] == expected_texts(model, prompt, params)
        for sample in out.outputs:
            assert sample.finish_reason in ("stop", "length")
            assert params.min_tokens <= len(sample.token_ids) <= params.max_new_tokens
            assert (sample.logprobs is None) == (params.logprobs is None)
            assert sample.logprobs is None or len(sample.logprobs) == len(sample.token_ids)
        assert (out.prompt_logprobs is None) == (params.prompt_logprobs is None)
        assert out.prompt_logprobs is None or len(out.prompt_logprobs) == len(prompt)
    assert_idle(llm.engine)


def test_a_fixed_mix_with_preemptions_and_copies(model):
    """One hand-picked run that certainly preempts samples and copies shared blocks (the random
    runs above usually do, not always)."""
    requests = [([5, 6, 7, 40, 41, 100], SamplingParams(n=3, temperature=1.0, seed=1, max_new_tokens=12,
                                                         ignore_eos=True, presence_penalty=1.0, top_k=20)),
                ([200, 255, 17], SamplingParams(n=2, temperature=0, max_new_tokens=12, ignore_eos=True,
                                                repetition_penalty=1.3, logit_bias={5: 2.5})),
                ([3, 3, 3, 3, 3], SamplingParams(n=1, temperature=0.5, seed=9, max_new_tokens=12, min_tokens=3,
                                                 stop_token_ids=(6,), min_p=0.05, top_p=0.9))]
    llm = LLM.__new__(LLM)
    llm.engine = make_engine(model, "paged-prefix", requests, 4, 2, 6)
    copies, preempted = [], []
    schedule = llm.engine.scheduler.schedule

    def recording():
        output = schedule()
        copies.extend(output.block_copies)
        preempted.extend(output.preempted_ids)
        return output

    llm.engine.scheduler.schedule = recording
    outputs = llm.generate([p for p, _ in requests], [sp for _, sp in requests], use_tqdm=False)
    assert copies and any("#" in rid for rid in preempted)
    for (prompt, params), out in zip(requests, outputs):
        assert [o.token_ids for o in out.outputs] == expected_samples(model, prompt, params)
    assert_idle(llm.engine)
