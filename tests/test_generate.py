"""Chapter 1's loops: equal to Hugging Face's greedy generation, with and without the KV cache."""

import pytest
import torch

from minillm.generate import generate, generate_with_cache, generate_without_cache
from minillm.model import load_model
from minillm.sampling import SamplingParams
from tests.hf_reference import FAMILIES, ByteTokenizer, hf_greedy, make_checkpoint

PROMPT = [5, 17, 99, 3, 250, 41, 7, 64]
GREEDY_32 = SamplingParams(temperature=0, max_new_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_checkpoint(request.param, folder, seed=1)
    return hf, load_model(folder, device="cpu")


@pytest.mark.parametrize("kv_cache", [False, True], ids=["no-cache", "kv-cache"])
def test_greedy_tokens_equal_hf_generate(pair, kv_cache):
    hf, ours = pair
    out = generate(ours, ByteTokenizer(), PROMPT, GREEDY_32, kv_cache=kv_cache)
    expected = hf_greedy(hf, PROMPT, 32)
    assert len(set(expected)) >= 6  # a varied sequence, not one token repeated
    assert out.token_ids == expected
    assert out.finish_reason == "length"
    assert len(out.metrics.token_times) == 32 and len(out.metrics.itls) == 31
    assert 0 < out.metrics.ttft <= out.metrics.latency


def test_stop_token_ends_generation_and_is_kept(pair):
    hf, ours = pair
    expected = hf_greedy(hf, PROMPT, 32)
    stop_at = next(i for i, t in enumerate(expected) if i >= 3 and t not in expected[:i])
    params = SamplingParams(temperature=0, max_new_tokens=32, stop_token_ids=(expected[stop_at],))
    for loop in (generate_with_cache, generate_without_cache):
        out = loop(ours, ByteTokenizer(), PROMPT, params)
        assert out.token_ids == expected[: stop_at + 1]
        assert out.finish_reason == "stop"


def test_eos_of_the_model_config_stops_unless_ignored(tmp_path):
    make_checkpoint("qwen2", tmp_path, seed=1)
    ours = load_model(tmp_path, device="cpu")
    free_run = generate(ours, ByteTokenizer(), PROMPT, GREEDY_32).token_ids
    first = free_run[0]
    object.__setattr__(ours.config, "eos_token_ids", (first,))  # pretend the first token is EOS
    out = generate(ours, ByteTokenizer(), PROMPT, SamplingParams(temperature=0, max_new_tokens=8))
    assert out.token_ids == [first] and out.finish_reason == "stop"
    out = generate(ours, ByteTokenizer(), PROMPT, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
    assert out.token_ids == free_run[:8]


def test_seeded_sampling_is_reproducible_and_the_loops_agree(pair):
    _, ours = pair
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_new_tokens=16, seed=7, ignore_eos=True)
    a = generate_with_cache(ours, ByteTokenizer(), PROMPT, params).token_ids
    b = generate_with_cache(ours, ByteTokenizer(), PROMPT, params).token_ids
    c = generate_without_cache(ours, ByteTokenizer(), PROMPT, params).token_ids
    other = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_new_tokens=16, seed=8, ignore_eos=True)
    d = generate_with_cache(ours, ByteTokenizer(), PROMPT, other).token_ids
    assert a == b == c
    assert a != d


def test_bad_prompts_raise_clear_errors(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="empty"):
        generate(ours, ByteTokenizer(), "", GREEDY_32)
    with pytest.raises(ValueError, match="context"):
        generate(ours, ByteTokenizer(), [1] * ours.config.max_position_embeddings, GREEDY_32)


def test_generation_stops_at_the_context_limit(pair):
    _, ours = pair
    limit = ours.config.max_position_embeddings
    out = generate(ours, ByteTokenizer(), [3] * (limit - 4), SamplingParams(temperature=0, max_new_tokens=50,
                                                                             ignore_eos=True))
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


@torch.inference_mode()
def test_loops_return_identical_logits_path_on_long_prompt(pair):
    """A prompt longer than a few blocks: cached and uncached loops still agree token for token."""
    _, ours = pair
    prompt = [(7 * i) % 250 + 3 for i in range(100)]
    a = generate_with_cache(ours, ByteTokenizer(), prompt, GREEDY_32).token_ids
    b = generate_without_cache(ours, ByteTokenizer(), prompt, GREEDY_32).token_ids
    assert a == b
