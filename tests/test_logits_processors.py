"""The batched sampler's pieces against Hugging Face transformers' own processors and warpers.

Logit bias, the repetition penalty, min_tokens and min-p equal transformers' processors exactly on
random logits and random histories; presence / frequency penalties equal OpenAI's formula computed
by hand; `warp` over a batch whose rows all differ equals `filtered_logits` row by row exactly; the
seeded draws of `StepSampler` equal `minillm.sampling.sample` per row; and the new SamplingParams
fields are validated (each bad value names its field)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minillm.logits_processors import RowHistory, process_logits, token_counts
from minillm.sampler import SamplingRow, StepSampler, sample_row, warp
from minillm.sampling import SamplingParams, filtered_logits, min_p_filter, sample, sample_seed

VOCAB = 64
EOS = (2,)


def random_logits(seed: int, rows: int = 1, vocab: int = VOCAB, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale  # (rows, vocab)


def random_tokens(seed: int, length: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def one_row(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """process_logits on one row (1, vocab)."""
    return process_logits(logits, [RowHistory(params, prompt, output)], EOS)


# ---------------------------------------------------------------------------------------- processors vs HF
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), penalty=st.floats(0.05, 2.0), prompt_len=st.integers(1, 20),
       output_len=st.integers(0, 20))
def test_repetition_penalty_equals_hf(seed, penalty, prompt_len, output_len):
    logits = random_logits(seed)
    prompt, output = random_tokens(seed + 1, prompt_len), random_tokens(seed + 2, output_len)
    params = SamplingParams(repetition_penalty=penalty)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits.clone())
    assert torch.equal(one_row(logits, params, prompt, output), expected)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), biases=st.dictionaries(st.integers(0, VOCAB - 1),
                                                           st.floats(-100, 100, allow_nan=False), min_size=1,
                                                           max_size=8))
def test_logit_bias_equals_hf_sequence_bias_with_one_token_sequences(seed, biases):
    logits = random_logits(seed)
    params = SamplingParams(logit_bias=biases)
    hf = SequenceBiasLogitsProcessor(sequence_bias=[[[token], bias] for token, bias in biases.items()])
    expected = hf(torch.tensor([[5, 6, 7]]), logits.clone())
    assert torch.equal(one_row(logits, params, [5, 6, 7], []), expected)


@pytest.mark.parametrize("min_tokens, generated", [(3, 0), (3, 2), (3, 3), (3, 7), (1, 0)])
@pytest.mark.parametrize("stop_token_ids, ignore_eos", [((), False), ((9, 40), False), ((9,), True)])
def test_min_tokens_equals_hf_min_new_tokens(min_tokens, generated, stop_token_ids, ignore_eos):
    logits = random_logits(min_tokens * 10 + generated)
    prompt, output = random_tokens(1, 6), random_tokens(2, generated)
    params = SamplingParams(min_tokens=min_tokens, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
                            max_new_tokens=10)
    ending = list(stop_token_ids) + ([] if ignore_eos else list(EOS))
    hf = MinNewTokensLengthLogitsProcessor(len(prompt), min_tokens, ending)
    expected = hf(torch.tensor([prompt + output]), logits.clone())
    got = one_row(logits, params, prompt, output)
    assert torch.equal(got, expected)
    if generated < min_tokens:  # the check has teeth: those tokens are masked, and only those
        assert torch.isinf(got[0, ending]).all() and torch.isfinite(got).sum() == VOCAB - len(set(ending))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), min_p=st.floats(0.0, 1.0), scale=st.sampled_from([0.5, 3.0, 20.0]))
def test_min_p_equals_hf(seed, min_p, scale):
    logits = random_logits(seed, rows=4, scale=scale)
    expected = MinPLogitsWarper(min_p)(None, logits.clone()) if min_p > 0 else logits
    assert torch.equal(min_p_filter(logits, min_p), expected)
    params = [SamplingParams(min_p=min_p)] * 4
    assert torch.equal(warp(logits, params), expected)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), presence=st.floats(-2, 2), frequency=st.floats(-2, 2),
       output_len=st.integers(0, 30))
def test_presence_and_frequency_penalties_follow_openais_formula(seed, presence, frequency, output_len):
    """OpenAI: mu[j] - c[j] * frequency - [c[j] > 0] * presence, c counting the *output* only (a
    prompt token the output never repeated is not penalised). Computed here element by element in
    float64, so compared with allclose: minillm computes in float32 (one rounding per operation)."""
    logits = random_logits(seed)
    prompt, output = random_tokens(seed + 1, 10), random_tokens(seed + 2, output_len, vocab=16)
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    got = one_row(logits, params, prompt, output)[0]
    expected = []
    for j, mu in enumerate(logits[0].tolist()):
        c = output.count(j)
        expected.append(mu - c * frequency - (1.0 if c > 0 else 0.0) * presence)
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=1e-6)
    untouched = [j for j in range(VOCAB) if j not in output]
    assert torch.equal(got[untouched], logits[0, untouched])  # prompt-only tokens: no change at all


def test_processors_chain_in_order_bias_repetition_openai_min_tokens_against_hf():
    """A row with every processor on: HF's sequence bias, then its repetition penalty (prompt and
    output), then OpenAI's penalties by hand, then HF's min-new-tokens mask."""
    logits = random_logits(77)
    prompt, output = random_tokens(3, 12), random_tokens(4, 5, vocab=20)
    bias = {2: 5.0, 7: -3.0, output[0]: 1.5}
    params = SamplingParams(logit_bias=bias, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25,
                            min_tokens=8, stop_token_ids=(11,), max_new_tokens=20)
    ids = torch.tensor([prompt + output])
    expected = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(ids, logits.clone())
    expected = RepetitionPenaltyLogitsProcessor(1.3)(ids, expected)
    counts = token_counts([output], VOCAB, torch.device("cpu")).float()
    expected = expected - 0.25 * counts - 0.5 * (counts > 0)
    expected = MinNewTokensLengthLogitsProcessor(len(prompt), 8, [11, *EOS])(ids, expected)
    torch.testing.assert_close(one_row(logits, params, prompt, output), expected, atol=1e-6, rtol=0)


def test_rows_are_processed_with_their_own_settings_and_histories():
    """One batch: each row equals that row processed alone, and rows asking nothing are untouched."""
    logits = random_logits(5, rows=5)
    rows = [RowHistory(SamplingParams(), [1, 2], [3]),
            RowHistory(SamplingParams(repetition_penalty=1.8), [4, 5, 6], [7, 7]),
            RowHistory(SamplingParams(logit_bias={3: 9.0}, frequency_penalty=1.0), [8], [3, 3, 9]),
            RowHistory(SamplingParams(min_tokens=2, stop_token_ids=(10,)), [11], [12]),
            RowHistory(SamplingParams(presence_penalty=-1.5, repetition_penalty=0.7), [13, 14], [])]
    batched = process_logits(logits, rows, EOS)
    for i, row in enumerate(rows):
        assert torch.equal(batched[i], process_logits(logits[i : i + 1], [row], EOS)[0]), i
    assert torch.equal(batched[0], logits[0])
    plain = [RowHistory(SamplingParams(temperature=0.5, top_k=3), [1], [2])] * 2
    head = logits[:2]
    assert process_logits(head, plain, EOS) is head  # nobody changes logits: no copy at all


def test_token_counts_counts_each_list():
    counts = token_counts([[1, 1, 3], [], [0, 5, 5, 5]], 6, torch.device("cpu"))
    assert counts.tolist() == [[0, 2, 0, 1, 0, 0], [0] * 6, [1, 0, 0, 0, 0, 3]]


# ---------------------------------------------------------------------------------------- warping
def hf_warped(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p with HF's warpers, in HF's order."""
    out = TemperatureLogitsWarper(params.temperature)(None, logits.clone())
    if params.top_k is not None:
        out = TopKLogitsWarper(params.top_k)(None, out)
    if params.top_p < 1.0:
        out = TopPLogitsWarper(params.top_p)(None, out)
    if params.min_p > 0:
        out = MinPLogitsWarper(params.min_p)(None, out)
    return out


WARP_SETTINGS = [SamplingParams(temperature=1.0),
                 SamplingParams(temperature=0.7, top_k=5),
                 SamplingParams(temperature=1.3, top_p=0.9),  # 1 - 0.9 is not 0.1 in float32: the boundary case
                 SamplingParams(temperature=0.5, top_p=0.8, top_k=20),
                 SamplingParams(temperature=2.0, min_p=0.1),
                 SamplingParams(temperature=1.0, top_k=1),
                 SamplingParams(temperature=0.9, top_k=10, top_p=0.95, min_p=0.05),
                 SamplingParams(temperature=1.0, top_k=VOCAB + 100),  # k above the vocabulary
                 SamplingParams(temperature=0.3, top_p=0.3)]


def test_warp_of_rows_with_different_settings_equals_each_row_alone_and_hf():
    logits = random_logits(11, rows=len(WARP_SETTINGS))
    batched = warp(logits, WARP_SETTINGS)
    for i, params in enumerate(WARP_SETTINGS):
        alone = filtered_logits(logits[i], params)
        assert torch.equal(batched[i], alone), params
        assert torch.equal(alone, hf_warped(logits[i : i + 1], params)[0]), params


def boundary_logits(p: float) -> torch.Tensor | None:
    """Logits [0, b, x] (p > 0.5) whose two less likely tokens have float32 probabilities summing,
    in float32 (softmax then cumsum, HF's computation), to exactly float32(1 - p): found by trying
    a few b and stepping x one float at a time from the exact value. None if none is found."""
    threshold = torch.tensor(1 - p, dtype=torch.float32)
    for b in range(40):
        base = torch.tensor([0.0, b * 0.05])
        x = torch.log(base.exp().sum() * (1 - threshold) / threshold)
        for _ in range(200):
            logits = torch.cat([base, x[None]])  # (3,)
            low = torch.sort(logits).values.softmax(-1).cumsum(-1)[1]
            if low == threshold:
                return logits.unsqueeze(0)  # (1, 3)
            x = torch.nextafter(x, torch.tensor(100.0 if low > threshold else -100.0))
    return None


@pytest.mark.parametrize("p", [0.9, 0.7, 0.95])
def test_top_p_boundary_where_one_minus_p_differs_in_float32(p):
    """The two least likely tokens' probabilities sum to exactly float32(1 - p), which is not the
    double 1 - p: HF compares in float32, so `<=` drops them; the batched and the scalar rule agree."""
    logits = boundary_logits(p)
    assert logits is not None
    assert float(torch.tensor(1 - p, dtype=torch.float32)) != 1 - p
    params = SamplingParams(top_p=p)
    expected = TopPLogitsWarper(p)(None, logits.clone())
    assert torch.isinf(expected[0, :2]).all() and torch.isfinite(expected[0, 2])  # the boundary tokens dropped
    assert torch.equal(warp(logits, [params]), expected)
    assert torch.equal(filtered_logits(logits[0], params), expected[0])
    mixed = torch.cat([logits, logits, logits])  # the same row under three settings in one batch
    batched = warp(mixed, [SamplingParams(top_p=0.99), params, SamplingParams(top_p=p, temperature=1.0, top_k=3)])
    assert torch.equal(batched[1], expected[0]) and torch.equal(batched[2], expected[0])
    assert torch.isfinite(batched[0]).all()


def test_top_p_rows_each_at_their_own_threshold():
    logits = random_logits(3, rows=6, scale=4.0)
    tops = [0.9, 0.1, 0.5, 0.99, 0.9, 1.0]
    batched = warp(logits, [SamplingParams(top_p=p) for p in tops])
    for i, p in enumerate(tops):
        assert torch.equal(batched[i], filtered_logits(logits[i], SamplingParams(top_p=p)))


@settings(max_examples=15, deadline=None)
@given(settings_list=st.lists(st.builds(SamplingParams,
                                        temperature=st.floats(0.05, 3.0),
                                        top_k=st.one_of(st.none(), st.integers(1, 80)),
                                        top_p=st.sampled_from([1.0, 0.9, 0.95, 0.5, 0.1, 0.8]),
                                        min_p=st.sampled_from([0.0, 0.05, 0.2, 0.9])),
                              min_size=1, max_size=6),
       seed=st.integers(0, 10_000))
def test_warp_equals_filtered_logits_row_by_row_for_any_mix(settings_list, seed):
    logits = random_logits(seed, rows=len(settings_list))
    batched = warp(logits, settings_list)
    for i, params in enumerate(settings_list):
        assert torch.equal(batched[i], filtered_logits(logits[i], params))


def test_step_sampler_draws_equal_sample_per_row_with_seeded_generators():
    rows_params = [SamplingParams(temperature=0.8, seed=1),
                   SamplingParams(temperature=0),  # greedy in the middle of sampling rows
                   SamplingParams(temperature=1.2, top_k=7, seed=2),
                   SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05, seed=3),
                   SamplingParams(temperature=0.6, repetition_penalty=1.5, logit_bias={4: 3.0}, seed=4),
                   SamplingParams(temperature=1.0, min_tokens=3, presence_penalty=1.0, seed=5, max_new_tokens=9)]
    histories = [([1, 2, 3], [4, 4, 5]), ([6], []), ([7, 8], [9]), ([10], [11, 12]), ([4, 13], [4, 14]),
                 ([2, 15], [16])]
    logits = random_logits(21, rows=len(rows_params), scale=2.0)
    generators = [p.make_generator() for p in rows_params]
    reference_generators = [p.make_generator() for p in rows_params]
    drawn = []
    for _step in range(4):  # several steps: each row's generator advances as it would alone
        rows = [SamplingRow(p, prompt, out, g) for p, (prompt, out), g in zip(rows_params, histories, generators)]
        tokens, failed = StepSampler(logits, rows, EOS).tokens(range(len(rows)))
        assert not failed
        for i, (p, (prompt, out)) in enumerate(zip(rows_params, histories)):
            processed = process_logits(logits[i : i + 1], [RowHistory(p, prompt, out)], EOS)[0]
            assert tokens[i] == sample(processed, p, reference_generators[i]), (i, p)
            if p.greedy:
                assert tokens[i] == sample_row(logits[i], SamplingRow(p, prompt, out), EOS) == int(processed.argmax())
        drawn.append(tokens)
    assert len({tuple(t.items()) for t in drawn}) > 1  # the sampling rows really sample


def test_step_sampler_argmax_and_probs_of_sampling_rows():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.5, top_k=3, seed=0),
              SamplingParams(temperature=0, logit_bias={9: 100.0})]
    logits = random_logits(8, rows=3)
    sampler = StepSampler(logits, [SamplingRow(p, [1], []) for p in params], EOS)
    assert sampler.argmax[0] == int(logits[0].argmax()) and sampler.argmax[2] == 9
    probs = sampler.probs(1, 1)[0]
    assert torch.equal(probs, filtered_logits(logits[1], params[1]).softmax(-1))
    assert int((probs > 0).sum()) == 3


def test_min_tokens_keeps_eos_out_of_reach_of_sample_row():
    logits = torch.full((VOCAB,), -5.0)
    logits[2] = 50.0  # EOS overwhelmingly likely
    params = SamplingParams(temperature=0, min_tokens=2, max_new_tokens=5)
    assert sample_row(logits, SamplingRow(params, [5], []), EOS) != 2
    assert sample_row(logits, SamplingRow(params, [5], [7]), EOS) != 2
    assert sample_row(logits, SamplingRow(params, [5], [7, 8]), EOS) == 2
    ignoring = SamplingParams(temperature=0, min_tokens=2, max_new_tokens=5, ignore_eos=True)
    assert sample_row(logits, SamplingRow(ignoring, [5], []), EOS) == 2  # EOS is no stop token then


# ---------------------------------------------------------------------------------------- SamplingParams
@pytest.mark.parametrize("field, value", [
    ("n", 0), ("n", 1.0), ("n", True), ("n", -2),
    ("min_p", -0.1), ("min_p", 1.5), ("min_p", float("nan")), ("min_p", "0.1"),
    ("min_tokens", -1), ("min_tokens", 1.5), ("min_tokens", 100),  # above max_new_tokens (64)
    ("presence_penalty", 2.5), ("presence_penalty", -2.1), ("presence_penalty", float("inf")),
    ("frequency_penalty", 3), ("frequency_penalty", float("nan")), ("frequency_penalty", True),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", 2.5),
    ("repetition_penalty", float("nan")),
    ("logit_bias", {5: 101.0}), ("logit_bias", {5: -100.5}), ("logit_bias", {-1: 1.0}), ("logit_bias", {"5": 1.0}),
    ("logit_bias", {5: float("nan")}), ("logit_bias", {5: float("inf")}), ("logit_bias", {True: 1.0}),
    ("logit_bias", [(5,)]), ("logit_bias", [(5, 1.0, 2.0)]), ("logit_bias", "5:1"), ("logit_bias", 5),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 1.0), ("logprobs", True),
    ("prompt_logprobs", -1), ("prompt_logprobs", 21), ("prompt_logprobs", "3"),
    ("include_stop_str_in_output", "yes"), ("include_stop_str_in_output", 1),
    ("skip_special_tokens", None), ("skip_special_tokens", 0),
])
def test_each_new_field_refuses_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("n", 20), ("min_p", 0.0), ("min_p", 1.0), ("min_tokens", 64), ("presence_penalty", -2.0),
    ("presence_penalty", 2.0), ("frequency_penalty", 2.0), ("repetition_penalty", 2.0), ("repetition_penalty", 0.01),
    ("logit_bias", {5: 100.0, 6: -100.0}), ("logprobs", 0), ("logprobs", 20), ("prompt_logprobs", 0),
    ("prompt_logprobs", 20), ("include_stop_str_in_output", True), ("skip_special_tokens", False),
    ("n", np.int64(3)), ("min_p", np.float32(0.5)), ("logprobs", np.int32(5)),
])
def test_the_edges_of_each_range_are_accepted(field, value):
    SamplingParams(**{field: value})


def test_logit_bias_dict_or_pairs_normalise_to_one_sorted_tuple():
    from_dict = SamplingParams(logit_bias={9: 1, 3: -2.5, np.int64(5): np.float32(0.5)})
    from_pairs = SamplingParams(logit_bias=[(5, 0.5), [3, -2.5], (9, 1.0)])
    assert from_dict.logit_bias == ((3, -2.5), (5, 0.5), (9, 1.0))
    assert from_dict == from_pairs and hash(from_dict) == hash(from_pairs)
    assert all(type(t) is int and type(b) is float for t, b in from_dict.logit_bias)
    assert SamplingParams(logit_bias={}).logit_bias == () == SamplingParams().logit_bias


def test_equal_params_hash_equal_whatever_the_number_types():
    a = SamplingParams(temperature=np.float64(0.5), n=np.int64(2), top_k=np.int32(4), presence_penalty=1,
                       frequency_penalty=np.float32(0.5), min_tokens=np.int64(1), logprobs=np.int8(3), seed=7,
                       stop_token_ids=[np.int64(9)], include_stop_str_in_output=np.bool_(True))
    b = SamplingParams(temperature=0.5, n=2, top_k=4, presence_penalty=1.0, frequency_penalty=0.5, min_tokens=1,
                       logprobs=3, seed=7, stop_token_ids=(9,), include_stop_str_in_output=True)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert type(a.n) is int and type(a.presence_penalty) is float and type(a.include_stop_str_in_output) is bool


def test_check_vocab_refuses_a_bias_outside_the_vocabulary():
    params = SamplingParams(logit_bias={255: 1.0})
    params.check_vocab(256)
    with pytest.raises(ValueError, match="logit_bias"):
        params.check_vocab(255)


def test_properties_say_what_the_sampler_must_do():
    assert not SamplingParams().changes_logits and not SamplingParams().has_penalties
    assert SamplingParams(repetition_penalty=1.1).has_penalties
    assert SamplingParams(presence_penalty=0.1).has_penalties and SamplingParams(frequency_penalty=-0.1).has_penalties
    assert SamplingParams(logit_bias={1: 0.0}).changes_logits and not SamplingParams(logit_bias={1: 0.0}).has_penalties
    assert SamplingParams(min_tokens=1).changes_logits


def test_for_sample_gives_each_sample_its_own_seed_and_n_one():
    params = SamplingParams(n=4, seed=123, temperature=0.8, logprobs=2)
    samples = [params.for_sample(i) for i in range(4)]
    assert all(s.n == 1 and s.temperature == 0.8 and s.logprobs == 2 for s in samples)
    assert samples[0].seed == 123
    assert [s.seed for s in samples[1:]] == [sample_seed(123, i) for i in (1, 2, 3)]
    assert len({s.seed for s in samples}) == 4 and all(0 <= s.seed < 2**64 for s in samples)
    assert SamplingParams(n=3).for_sample(2).seed is None  # unseeded stays unseeded
    assert sample_seed(123, 1) != sample_seed(124, 1)
    for bad in (-1, 4, 10):
        with pytest.raises(ValueError, match="sample index"):
            params.for_sample(bad)
    assert math.isfinite(float(sample_seed(2**64 - 1, 3)))
