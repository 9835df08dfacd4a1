"""Speculative decoding in the engine (chapter 7): greedy tokens equal the naive loop's with either
proposer, any k, both caches, the prefix cache, chunked prefill, preemption and aborts (no block
leaks: tests/conftest.py); a stop inside an accepted run ends the request there; and sampling keeps
the target's distribution, checked statistically on a model with a vocabulary of 8."""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.model import load_model
from minillm.sampling import SamplingParams, filtered_logits
from tests.hf_reference import ByteTokenizer, make_checkpoint
from tests.test_engine import _reference, paged_budget

REPEATS = [5, 6, 7, 8] * 6  # a prompt that repeats itself: the n-gram proposer finds something to propose


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory):
    """A second tiny random model with the test model's vocabulary: a poor guesser, so that guesses
    are rejected often."""
    folder = tmp_path_factory.mktemp("draft")
    make_checkpoint("qwen3", folder, seed=11, num_hidden_layers=1)
    return str(folder)


@pytest.fixture(scope="module")
def same_draft_folder(tmp_path_factory):
    """The test model itself as its own draft: every greedy guess is right."""
    folder = tmp_path_factory.mktemp("same")
    make_checkpoint("qwen3", folder, seed=3)
    return str(folder)


def greedy(n: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True, **kwargs)


def spec_engine(model, method: str, k: int, draft: str | None, kind: str = "contiguous", block_size: int = 8,
                num_blocks: int = 64, **overrides) -> LLMEngine:
    settings = {"max_num_seqs": 4, "max_model_len": 96} | overrides
    if kind != "contiguous":
        settings |= {"kv": "paged", "block_size": block_size, "prefix_cache": kind == "prefix",
                     "kv_cache_bytes": paged_budget(model, block_size, num_blocks,
                                                      draft if method == "draft" else None)}
    spec = SpeculativeConfig(method, k, draft if method == "draft" else None)
    return LLMEngine(model, ByteTokenizer(), EngineConfig(speculative=spec, **settings))


arrivals_strategy = st.lists(st.tuples(st.integers(0, 3),  # steps before it arrives
                                       st.integers(0, 20),  # how much of the repeating prefix it starts with
                                       st.lists(st.integers(3, 255), max_size=12),  # its own tail
                                       st.integers(1, 16)),  # new tokens
                             min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=arrivals_strategy, method=st.sampled_from(["draft", "ngram"]), k=st.integers(1, 6),
       kind=st.sampled_from(["contiguous", "paged", "prefix"]), chunk=st.sampled_from([None, 3, 16]),
       spare_blocks=st.integers(0, 4), abort_at=st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 8))))
def test_greedy_speculation_gives_the_naive_loops_tokens(model, draft_folder, arrivals, method, k, kind, chunk,
                                                         spare_blocks, abort_at):
    requests = [(wait, (REPEATS[:cut] + tail) or [5], n) for wait, cut, tail, n in arrivals]
    longest = max(len(p) + n for _, p, n in requests)
    chunking = {"chunked_prefill": True, "max_tokens_per_prefill_chunk": chunk} if chunk else {}
    engine = spec_engine(model, method, k, draft_folder, kind, 8, -(-(longest + k) // 8) + spare_blocks, **chunking)
    ids = []
    for wait, prompt, n in requests:
        for _ in range(wait):
            if engine.has_unfinished():
                engine.step()
        ids.append(engine.add_request(prompt, greedy(n)).request_id)
    step = 0
    while engine.has_unfinished():
        if abort_at is not None and step == abort_at[1] and abort_at[0] < len(ids):
            engine.abort(ids[abort_at[0]])
        engine.step()
        step += 1
    for (_, prompt, n), request_id in zip(requests, ids):
        out = engine.output(request_id)
        if out.finish_reason == "abort":
            assert out.token_ids == _reference(model, tuple(prompt), n)[: len(out.token_ids)]
        else:
            assert out.token_ids == _reference(model, tuple(prompt), n)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_guesses_are_verified_many_per_pass_and_the_trace_records_the_verdicts(model, same_draft_folder, method):
    engine = spec_engine(model, method, 4, same_draft_folder, "paged")
    request = engine.add_request(REPEATS[:12], greedy(20))
    while engine.has_unfinished():
        engine.step()
    assert engine.output(request.request_id).token_ids == _reference(model, tuple(REPEATS[:12]), 20)
    metrics = engine.speculative_metrics
    verdicts = [v for s in engine.trace.steps for v in s.speculation.values()]
    assert verdicts and metrics["drafted"] == sum(len(d) for d, _ in verdicts)
    assert metrics["accepted"] == sum(len(kept) - 1 for _, kept in verdicts)
    examined = sum(len(kept) - 1 + (len(kept) - 1 < len(d)) for d, kept in verdicts)  # a refusal ends the examining
    assert metrics["alpha"] == pytest.approx(metrics["accepted"] / examined)
    assert metrics["acceptance_rate"] <= metrics["alpha"] <= 1
    if method == "draft":  # the model guessing for itself: every guess right, k + 1 tokens per pass
        assert metrics["acceptance_rate"] == 1.0
        assert all(kept[:-1] == drafted for drafted, kept in verdicts)
        assert len(engine.trace.steps) <= 1 + -(-19 // 5)
    assert metrics["tokens_per_pass"] > 1


def test_a_stop_inside_an_accepted_run_ends_the_request_there(model, same_draft_folder):
    prompt = [40, 41, 42]
    expected = _reference(model, tuple(prompt), 12)
    stop_at = 5  # the 6th token stops the request, in the middle of a run of accepted guesses
    engine = spec_engine(model, "draft", 4, same_draft_folder, "paged")
    first = next(i for i, t in enumerate(expected) if t == expected[stop_at])  # the token's first occurrence
    request = engine.add_request(prompt, greedy(12, stop_token_ids=[expected[stop_at]]))
    streamed = []
    while engine.has_unfinished():
        streamed += [u.delta for u in engine.step() if u.request_id == request.request_id]
    out = engine.output(request.request_id)
    assert out.finish_reason == "stop" and out.token_ids == expected[: first + 1]
    assert "".join(streamed) == out.text  # nothing past the stop was streamed
    assert len(out.metrics.token_times) == len(out.token_ids)


def test_max_new_tokens_is_never_passed(model, same_draft_folder):
    engine = spec_engine(model, "draft", 6, same_draft_folder, "paged")
    ids = [engine.add_request([9, 10, 11], greedy(n)).request_id for n in (1, 2, 7, 8)]
    while engine.has_unfinished():
        engine.step()
    assert [len(engine.output(i).token_ids) for i in ids] == [1, 2, 7, 8]


def test_a_draft_with_another_vocabulary_or_batching_is_refused(model, tmp_path):
    make_checkpoint("qwen3", tmp_path, seed=5, vocab_size=300)
    with pytest.raises(ValueError, match="a draft must use the target's tokenizer"):
        LLMEngine(model, ByteTokenizer(), EngineConfig(speculative=SpeculativeConfig("draft", 2, str(tmp_path))))
    with pytest.raises(ValueError, match="needs batching='continuous'"):
        EngineConfig(batching="static", speculative=SpeculativeConfig("ngram", 2))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig("ngram", 0)
    with pytest.raises(ValueError, match="speculative method"):
        SpeculativeConfig("medusa", 2)


# ---------------------------------------------------------------------------------------------------- sampling

VOCAB = 8
PROMPT = [3, 5, 1, 6]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A target and a (different) draft with a vocabulary of 8: every outcome of two tokens is countable."""
    folders = [tmp_path_factory.mktemp(name) for name in ("target8", "draft8")]
    make_checkpoint("qwen3", folders[0], seed=21, vocab_size=VOCAB)
    make_checkpoint("qwen3", folders[1], seed=22, vocab_size=VOCAB, num_hidden_layers=1)
    return load_model(folders[0], device="cpu"), str(folders[1])


def exact_distribution(model, params: SamplingParams) -> torch.Tensor:
    """P(2nd token, 3rd token) after PROMPT, summed over the 1st: (VOCAB, VOCAB), from the target's logits."""
    from minillm.attention import DenseAttention

    def next_probs(seqs: list[list[int]]) -> torch.Tensor:
        lengths = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s])
        positions = torch.tensor([p for n in lengths for p in range(n)])
        with torch.inference_mode():
            hidden = model(ids, positions, DenseAttention(lengths))
            last = torch.tensor(lengths).cumsum(0) - 1
            return filtered_logits(model.logits(hidden[last]), params).softmax(-1).double()

    first = next_probs([PROMPT])[0]  # (VOCAB,)
    second = next_probs([PROMPT + [a] for a in range(VOCAB)])  # (VOCAB, VOCAB): [a, b]
    pairs = itertools.product(range(VOCAB), repeat=2)
    third = next_probs([PROMPT + [a, b] for a, b in pairs]).view(VOCAB, VOCAB, VOCAB)  # [a, b, c]
    joint = first[:, None, None] * second[:, :, None] * third  # P(a, b, c)
    return joint.sum(0)  # P(b, c)


@pytest.mark.parametrize("top_p", [1.0, 0.8], ids=["temperature-1", "top-p-0.8"])
def test_speculative_sampling_keeps_the_targets_distribution(small_vocab, top_p):
    """6,000 requests with seeds 0..5999, 3 new tokens each: the 1st comes from the prefill, the 2nd and
    3rd from a verification of the draft's guesses. Threshold: total variation 0.05 between the counted
    (2nd, 3rd) pairs and the exact distribution (64 outcomes; sampling noise alone is about 0.03). The
    draft's own distribution is far from the target's (checked), so keeping unverified guesses would fail."""
    model, draft = small_vocab
    params = [SamplingParams(temperature=1.0, top_p=top_p, max_new_tokens=3, ignore_eos=True, seed=s)
              for s in range(6000)]
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=64, max_model_len=16,
                                                             speculative=SpeculativeConfig("draft", 2, draft)))
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for batch in range(0, len(params), 500):
        ids = [engine.add_request(PROMPT, p).request_id for p in params[batch : batch + 500]]
        while engine.has_unfinished():
            engine.step()
        for request_id in ids:
            tokens = engine.output(request_id).token_ids
            counts[tokens[1], tokens[2]] += 1
            engine.release(request_id)
    assert engine.speculative_metrics["drafted"] > 5000  # the tokens really came through verification
    exact = exact_distribution(model, params[0])
    tv = 0.5 * float((counts / counts.sum() - exact).abs().sum())
    draft_tv = 0.5 * float((exact_distribution(load_model(draft, device="cpu"), params[0]) - exact).abs().sum())
    print(f"total variation: speculative sampling vs the target {tv:.3f}; the draft's own distribution {draft_tv:.3f}")
    assert tv < 0.05
    assert draft_tv > 0.15


# ------------------------------------------------------------------------------------ what the hostile probe found


def test_sampled_guesses_cut_by_the_step_budget_are_verified_with_their_own_distributions(model, draft_folder):
    """The budget keeps only some of a request's guesses: the rule must get q for exactly those (it
    used to get all k rows and fail the request)."""
    engine = spec_engine(model, "draft", 4, draft_folder, max_tokens_per_step=8)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True, seed=1)
    ids = [engine.add_request(p, params).request_id for p in ([5, 6, 7], [9, 10, 11])]
    while engine.has_unfinished():
        engine.step()
    assert [engine.output(i).finish_reason for i in ids] == ["length", "length"]
    assert any(0 < len(d) < 4 for s in engine.trace.steps for d, _ in s.speculation.values())


def test_guesses_never_cost_another_request_its_token(model, same_draft_folder):
    """Guesses ride along last: with a budget of 5, two decoding requests both advance every step, and
    a newcomer is admitted at once (one request's guesses used to take the whole budget until it
    finished)."""
    engine = spec_engine(model, "draft", 4, same_draft_folder, max_tokens_per_step=5)
    a = engine.add_request([5, 6], greedy(16)).request_id
    b = engine.add_request([9, 10, 11], greedy(16)).request_id
    counts, late = [], None
    while engine.has_unfinished():
        engine.step()
        counts.append((engine.requests[a].num_output_tokens, engine.requests[b].num_output_tokens))
        if len(counts) == 2:
            late = engine.add_request([7, 8], greedy(4)).request_id
        elif len(counts) == 3:
            assert engine.requests[late].num_output_tokens == 1  # admitted in the step after it arrived
    for (a0, b0), (a1, b1) in itertools.pairwise(counts):
        assert (a1 > a0 or a1 == 16) and (b1 > b0 or b1 == 16)
    assert engine.output(a).token_ids == _reference(model, (5, 6), 16)
    assert engine.output(late).token_ids == _reference(model, (7, 8), 4)


def test_guesses_never_preempt(model, draft_folder):
    """A pool that fits the requests but not their guesses: guesses shrink to the free blocks, nobody
    is preempted for them."""
    params = [([5 + i] * 8, greedy(n)) for i, n in enumerate((24, 8))]
    plain = spec_engine(model, "ngram", 4, None, "paged", block_size=4, num_blocks=8)
    spec = spec_engine(model, "draft", 4, draft_folder, "paged", block_size=4, num_blocks=8)
    for engine in (plain, spec):
        ids = [engine.add_request(p, sp).request_id for p, sp in params]
        while engine.has_unfinished():
            engine.step()
        assert not any(s.preempted for s in engine.trace.steps)
        assert [engine.output(i).token_ids for i in ids] == [_reference(model, tuple(p), sp.max_new_tokens)
                                                             for p, sp in params]


def test_a_request_id_reused_after_an_abort_starts_a_fresh_draft_cache(model, same_draft_folder):
    """The draft model's cache for an aborted request is not taken for a new request with its id."""
    rates = []
    for reuse in (False, True):
        engine = spec_engine(model, "draft", 4, same_draft_folder)
        engine.add_request(list(range(30, 50)), greedy(30), request_id="x")
        for _ in range(3):
            engine.step()
        engine.abort("x")
        new_id = "x" if reuse else "y"
        engine.add_request(list(range(100, 120)), greedy(12), request_id=new_id)
        while engine.has_unfinished():
            engine.step()
        assert engine.output(new_id).token_ids == _reference(model, tuple(range(100, 120)), 12)
        verdicts = [s.speculation[new_id] for s in engine.trace.steps[3:] if new_id in s.speculation]
        rates.append(sum(len(kept) - 1 for _, kept in verdicts) / sum(len(d) for d, _ in verdicts))
    assert rates == [1.0, 1.0]  # the model drafting for itself: every guess right, whatever the id


def test_metrics_count_the_tokens_delivered_and_a_one_token_last_chunk_is_a_verification(model, same_draft_folder):
    # a stop token inside a run of kept guesses: tokens_per_pass counts what the request got
    engine = spec_engine(model, "draft", 4, same_draft_folder)
    reference = _reference(model, (40, 41, 42), 10)
    request = engine.add_request([40, 41, 42], greedy(10, stop_token_ids=[reference[2]]))
    while engine.has_unfinished():
        engine.step()
    assert engine.output(request.request_id).token_ids == reference[:3]
    metrics = engine.speculative_metrics
    assert metrics["tokens_per_pass"] * metrics["passes"] == 2  # the first token came from the prefill
    # chunks of 3 for a 7-token prompt: the last chunk is 1 token, which brings guesses: counted and traced
    engine = spec_engine(model, "draft", 4, same_draft_folder, chunked_prefill=True, max_tokens_per_prefill_chunk=3)
    request = engine.add_request([9, 8, 7, 6, 5, 4, 3], greedy(10))
    while engine.has_unfinished():
        engine.step()
    verdicts = [s.speculation[request.request_id] for s in engine.trace.steps if request.request_id in s.speculation]
    assert engine.speculative_metrics["drafted"] == sum(len(d) for d, _ in verdicts)
    assert sum(len(kept) for _, kept in verdicts) == 10  # every token came through a verification


def test_the_draft_cache_is_checked_against_memory(model, same_draft_folder, monkeypatch):
    import minillm.engine as engine_module

    monkeypatch.setattr(engine_module, "available_bytes", lambda device: 1 << 16)
    with pytest.raises(ValueError, match="the draft model's cache"):
        spec_engine(model, "draft", 4, same_draft_folder, max_num_seqs=64)


def test_a_path_names_the_draft_model(model, same_draft_folder):
    from pathlib import Path

    assert SpeculativeConfig("draft", 2, Path(same_draft_folder)).draft_model == same_draft_folder


# ---------------------------------------------------------- the draft model after scheduling, on the target's blocks


@pytest.mark.parametrize("kind, overrides", [
    ("contiguous", {}),
    ("paged", {}),
    ("paged", {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 3}),
    ("prefix", {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 5}),
    ("prefix", {"num_blocks": 12}),  # preempts: the readmitted requests hit their own cached blocks
])
def test_a_draft_that_is_the_target_has_every_guess_kept_on_every_cache(model, same_draft_folder, kind, overrides):
    """The draft model's cache follows the target's (the same slots or blocks: prefill chunks, prefix
    hits, preemption, a run of guesses all kept): drafting for itself, it must guess right every
    time. A missing or stale draft entry shows as a refused guess."""
    overrides = {"num_blocks": 64} | overrides
    engine = spec_engine(model, "draft", 3, same_draft_folder, kind, block_size=4, **overrides)
    shared = list(range(60, 76))  # 4 blocks every request starts with (prefix hits)
    prompts = [shared + [7 + i] * (1 + 3 * i) for i in range(4)]
    ids = []
    for prompt in prompts:
        ids.append(engine.add_request(prompt, greedy(14)).request_id)
        engine.step()
    while engine.has_unfinished():
        engine.step()
    for prompt, request_id in zip(prompts, ids):
        assert engine.output(request_id).token_ids == _reference(model, tuple(prompt), 14)
    metrics = engine.speculative_metrics
    assert metrics["drafted"] > 20 and metrics["acceptance_rate"] == 1.0
    if overrides["num_blocks"] == 12:
        assert engine.num_preemptions > 0
    if kind == "prefix":
        assert engine.prefix_cache_hit_rate > 0


def test_the_draft_proposes_only_for_the_requests_verifying_this_step_with_its_prefill_chunked(model,
                                                                                                same_draft_folder):
    """The proposer runs after the scheduler: it guesses only into the room a chunk reserved, and its
    first pass feeds each request what the target's pass feeds it (a prefill chunk), plus at most the
    one kept guess it has not seen."""
    engine = spec_engine(model, "draft", 4, same_draft_folder, "paged", max_tokens_per_step=6, chunked_prefill=True,
                         max_tokens_per_prefill_chunk=3)
    proposer, seen = engine.proposer, []
    propose, run_pass = proposer.propose, proposer._pass

    def recording_propose(output, requests, sampling):
        proposals = propose(output, requests, sampling)
        room = {c.request_id: c.num_lookahead for c in output.chunks}
        seen.append((room, {rid: len(p.token_ids) for rid, p in proposals.items()}))
        return proposals

    def recording_pass(chunks, feeds, rows):
        for chunk, (start, tokens) in zip(chunks, feeds):
            assert start + len(tokens) >= chunk.start + 1 and start >= chunk.start - 1  # the lag: one kept guess
            assert len(tokens) <= 3 + 1
        return run_pass(chunks, feeds, rows)

    proposer.propose, proposer._pass = recording_propose, recording_pass
    ids = [engine.add_request(list(range(20 + 9 * i, 29 + 9 * i)), greedy(10)).request_id for i in range(3)]
    while engine.has_unfinished():
        engine.step()
    for i, request_id in enumerate(ids):
        assert engine.output(request_id).token_ids == _reference(model, tuple(range(20 + 9 * i, 29 + 9 * i)), 10)
    assert any(0 in room.values() and guessed for room, guessed in seen)  # steps where some chunk had no room
    for room, guessed in seen:
        assert set(guessed) == {rid for rid, n in room.items() if n}  # exactly the requests with room
        assert all(0 < n <= room[rid] for rid, n in guessed.items())


def test_the_draft_cache_shares_the_target_blocks_and_budget(model, same_draft_folder):
    engine = spec_engine(model, "draft", 2, same_draft_folder, "paged", num_blocks=10)
    draft_cache = engine.proposer.cache
    assert draft_cache.num_blocks == engine.cache.num_blocks == engine.pool.num_blocks == 10
    assert draft_cache.nbytes + engine.cache.nbytes == engine.config.kv_cache_bytes


def test_a_block_whose_last_kept_guess_the_draft_has_not_seen_is_not_found_in_the_prefix_cache(model,
                                                                                                same_draft_folder):
    """A ends on a verification that kept all its guesses: the draft never fed the last one, so the
    block holding it must not be found by B, whose prompt is A's whole text (a chat's next turn)."""
    engine = spec_engine(model, "draft", 3, same_draft_folder, "prefix", block_size=4)
    a_prompt = list(range(60, 76))  # 4 blocks; A's 5 tokens fill a 5th: the first, then 3 kept guesses and 1
    a = engine.add_request(a_prompt, greedy(5)).request_id
    while engine.has_unfinished():
        engine.step()
    b_prompt = a_prompt + engine.output(a).token_ids + [9, 9, 9]
    b = engine.add_request(b_prompt, greedy(16)).request_id
    while engine.has_unfinished():
        engine.step()
    assert engine.requests[b].num_cached_tokens == 16  # not 20
    assert engine.output(b).token_ids == _reference(model, tuple(b_prompt), 16)
    assert engine.speculative_metrics["acceptance_rate"] == 1.0
