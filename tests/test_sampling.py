"""SamplingParams validation and the top-k / top-p filters against transformers' logits warpers."""

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from minillm.sampling import SamplingParams, filtered_logits, sample, top_k_filter, top_p_filter


@pytest.mark.parametrize("k", [1, 2, 5, 50, 1000])
def test_top_k_matches_hf(k):
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(k))
    expected = TopKLogitsWarper(top_k=k)(None, logits.clone())
    assert torch.equal(top_k_filter(logits, k), expected)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.99])
def test_top_p_matches_hf_including_the_boundary_token(p):
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(int(p * 100))) * 3
    expected = TopPLogitsWarper(top_p=p)(None, logits.clone())
    got = top_p_filter(logits, p)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got, expected)


def test_top_p_keeps_the_token_that_crosses_the_boundary():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # 0.5 alone is below 0.6; adding 0.3 crosses it, so both stay
    assert torch.isfinite(top_p_filter(logits, 0.6)).tolist() == [True, True, False, False]


def test_ties_at_the_k_th_value_are_kept_as_hf_keeps_them():
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[True, True, True, True, False]]


def test_full_chain_matches_hf_order():
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(3)) * 2
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
    expected = logits.clone()
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)):
        expected = warper(None, expected)
    torch.testing.assert_close(filtered_logits(logits, params), expected)


def test_seeded_sampling_is_reproducible_and_respects_filters():
    logits = torch.randn(500, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_k=3, seed=11)
    draws = [sample(logits, params, params.make_generator()) for _ in range(5)]
    assert len(set(draws)) == 1  # a fresh generator with the same seed draws the same token
    g = params.make_generator()
    many = {sample(logits, params, g) for _ in range(200)}
    assert many <= set(torch.topk(logits, 3).indices.tolist()) and len(many) > 1


def test_greedy_is_argmax_and_tiny_temperatures_are_greedy():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1)) * 30
    for temperature in (0, 0.0, 1e-38, 5e-6):  # 1e-38 would overflow float32: logits / t = inf
        params = SamplingParams(temperature=temperature)
        assert params.greedy and sample(logits, params) == int(logits.argmax())
    assert not SamplingParams(temperature=1e-5).greedy


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.1, "temperature must be a number in"),
    ("temperature", float("nan"), "temperature must be a number in"),
    ("temperature", True, "temperature must be a number in"),
    ("temperature", "0.7", "temperature must be a number in"),
    ("top_k", 0, "top_k must be"),
    ("top_k", True, "top_k must be"),
    ("top_k", 2.0, "top_k must be"),
    ("top_p", 0.0, "top_p must be a number in"),
    ("top_p", 1.5, "top_p must be a number in"),
    ("top_p", float("inf"), "top_p must be a number in"),
    ("max_new_tokens", 0, "max_new_tokens must be"),
    ("max_new_tokens", 2.5, "max_new_tokens must be"),
    ("stop", ("",), "stop must hold"),
    ("stop_token_ids", (-1,), "stop_token_ids must hold"),
    ("stop_token_ids", (True,), "stop_token_ids must hold"),
    ("stop_token_ids", 5, "stop_token_ids must be a list"),
    ("stop", 5, "stop must be a list"),
    ("ignore_eos", "no", "ignore_eos must be"),
    ("seed", -3, "seed must be"),
    ("seed", True, "seed must be"),
    ("seed", 2**64, "seed must be an integer in"),
    ("seed", 1.5, "seed must be"),
])
def test_invalid_params_name_the_field_and_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_a_single_stop_string_is_accepted():
    assert SamplingParams(stop="\n").stop == ("\n",)
