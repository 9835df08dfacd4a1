"""Log-probabilities are the model's own: the engine's `logprobs` (output tokens) and
`prompt_logprobs` equal Hugging Face transformers' `log_softmax(hf_model(ids).logits)` (fp32, atol
1e-4), ranks and top-N included, whatever the engine does on the way — chunked prefill, the prefix
cache, preemption, speculative decoding, stop strings — and the naive loops report the same."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine, RequestOutput
from minillm.generate import generate_with_cache, generate_without_cache
from minillm.logprobs import TokenLogprob, token_logprobs
from minillm.model import load_model
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer, make_checkpoint
from tests.test_engine import paged_budget

ATOL = 1e-4
PROMPTS = [[5, 17, 99, 3, 250, 41, 7, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71],
           [88, 12, 40],
           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def pair(request, tmp_path_factory):
    """(HF model, minillm model) from one tiny random checkpoint."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_checkpoint(request.param, folder, seed=3)
    return hf, load_model(folder, device="cpu")


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-logprobs")
    hf = make_checkpoint("qwen3", folder, seed=3)
    return hf, load_model(folder, device="cpu")


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory):
    """The target's own weights as its draft: its guesses are accepted (a random draft's never are)."""
    folder = tmp_path_factory.mktemp("draft-logprobs")
    make_checkpoint("qwen3", folder, seed=3)
    return str(folder)


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """HF's log_softmax over every position of `ids`: (len(ids), vocab); row i predicts token i + 1."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_entry(entry: TokenLogprob, row: torch.Tensor, token: int, num_top: int) -> None:
    """One reported logprob against HF's row: the value, the rank (up to ties closer than ATOL) and
    the top-N, most likely first."""
    assert entry.token_id == token
    assert entry.logprob == pytest.approx(float(row[token]), abs=ATOL)
    value = float(row[token])
    assert int((row > value + ATOL).sum()) + 1 <= entry.rank <= int((row > value - ATOL).sum()) + 1
    assert len(entry.top) == num_top
    top_values = row.topk(num_top).values.tolist() if num_top else []
    for (top_id, top_value), expected in zip(entry.top, top_values):
        assert top_value == pytest.approx(expected, abs=ATOL)  # the i-th most likely value
        assert top_value == pytest.approx(float(row[top_id]), abs=ATOL)  # and it is that token's
    values = [v for _, v in entry.top]
    assert values == sorted(values, reverse=True)
    assert len({t for t, _ in entry.top}) == num_top
    if num_top and entry.rank == 1:
        assert entry.top[0][1] == pytest.approx(entry.logprob, abs=ATOL)


def check_output(hf, prompt: list[int], token_ids: list[int], logprobs, prompt_logprobs, num_top: int | None,
                 num_prompt_top: int | None) -> None:
    """Every output logprob (one per token) and prompt logprob (the first None) against HF."""
    rows = hf_logprobs(hf, prompt + token_ids)
    if num_top is None:
        assert logprobs is None
    else:
        assert logprobs is not None and len(logprobs) == len(token_ids)
        for i, (entry, token) in enumerate(zip(logprobs, token_ids)):
            check_entry(entry, rows[len(prompt) + i - 1], token, num_top)
    if num_prompt_top is None:
        assert prompt_logprobs is None
    else:
        assert prompt_logprobs is not None and len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
        for j in range(1, len(prompt)):
            check_entry(prompt_logprobs[j], rows[j - 1], prompt[j], num_prompt_top)


def run(engine: LLMEngine, prompts, params) -> list[RequestOutput]:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp).request_id for p, sp in zip(prompts, params)]
    while engine.has_unfinished():
        engine.step()
    return [engine.output(i) for i in ids]


def paged(model, block_size: int = 8, num_blocks: int = 64, **kw) -> dict:
    return dict(kv="paged", block_size=block_size, kv_cache_bytes=paged_budget(model, block_size, num_blocks), **kw)


def asking(**kw) -> SamplingParams:
    base = dict(temperature=0, max_new_tokens=10, ignore_eos=True, logprobs=5, prompt_logprobs=3)
    return SamplingParams(**(base | kw))


# ---------------------------------------------------------------------------------------- the engine
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_engine_logprobs_equal_hf_log_softmax(pair, kind):
    hf, model = pair
    settings = paged(model) if kind == "paged" else {}
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=4, max_model_len=64, **settings))
    params = [asking(), asking(temperature=1.0, seed=4, logprobs=0, prompt_logprobs=20),
              asking(temperature=1.5, top_k=40, seed=9, prompt_logprobs=None, repetition_penalty=1.5)]
    outputs = run(engine, PROMPTS, params)
    for prompt, p, out in zip(PROMPTS, params, outputs):
        check_output(hf, prompt, out.token_ids, out.logprobs, out.prompt_logprobs, p.logprobs, p.prompt_logprobs)
    # raw logprobs: sampled at a high temperature under a penalty, some token was not the model's favourite
    assert any(e.rank > 1 for out in outputs[1:] for e in out.logprobs)


def test_no_logprobs_unless_asked(qwen3_pair):
    _, model = qwen3_pair
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=2, max_model_len=64))
    (out,) = run(engine, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True))
    assert out.logprobs is None and out.prompt_logprobs is None and out.outputs[0].logprobs is None


@pytest.mark.parametrize("chunk", [1, 5])
def test_prompt_logprobs_across_prefill_chunks(qwen3_pair, chunk):
    hf, model = qwen3_pair
    config = EngineConfig(max_num_seqs=3, max_model_len=64, chunked_prefill=True, max_tokens_per_prefill_chunk=chunk,
                          max_tokens_per_step=max(chunk, 4), **paged(model))
    engine = LLMEngine(model, ByteTokenizer(), config)
    outputs = run(engine, PROMPTS, asking())
    first = outputs[0].request_id
    prefill_steps = [s for s in engine.trace.steps if first in s.prefill_tokens]
    assert len(prefill_steps) >= -(-len(PROMPTS[0]) // chunk)  # the long prompt really spanned chunks
    for prompt, out in zip(PROMPTS, outputs):
        check_output(hf, prompt, out.token_ids, out.logprobs, out.prompt_logprobs, 5, 3)


def test_prefix_cache_does_not_cut_prompt_logprobs(qwen3_pair):
    """A second request with the same prompt still gets every prompt logprob (it skips the cache);
    one that does not ask for them does hit the cache."""
    hf, model = qwen3_pair
    config = EngineConfig(max_num_seqs=2, max_model_len=64, prefix_cache=True, **paged(model, block_size=4))
    engine = LLMEngine(model, ByteTokenizer(), config)
    prompt = PROMPTS[0]
    (first,) = run(engine, [prompt], asking())
    (second,) = run(engine, [prompt], asking(logprobs=2, prompt_logprobs=4))
    (plain,) = run(engine, [prompt], asking(prompt_logprobs=None))
    for out, p in ((first, asking()), (second, asking(logprobs=2, prompt_logprobs=4))):
        check_output(hf, prompt, out.token_ids, out.logprobs, out.prompt_logprobs, p.logprobs, p.prompt_logprobs)
    assert second.num_cached_tokens == 0
    assert plain.num_cached_tokens > 0 and plain.prompt_logprobs is None  # the cache was there to be hit
    check_output(hf, prompt, plain.token_ids, plain.logprobs, None, 5, None)
    assert first.token_ids == second.token_ids == plain.token_ids


@pytest.mark.parametrize("chunked", [False, True])
def test_preemption_neither_duplicates_prompt_logprobs_nor_shifts_output_logprobs(qwen3_pair, chunked):
    hf, model = qwen3_pair
    prompts = [PROMPTS[0], PROMPTS[2], [30, 31, 32, 33, 34, 35, 36, 37, 38]]
    longest = max(len(p) for p in prompts) + 20
    chunking = dict(chunked_prefill=True, max_tokens_per_prefill_chunk=5) if chunked else {}
    config = EngineConfig(max_num_seqs=3, max_model_len=64, max_tokens_per_step=64, **chunking,
                          **paged(model, block_size=4, num_blocks=-(-longest // 4) + 2))
    engine = LLMEngine(model, ByteTokenizer(), config)
    params = [asking(max_new_tokens=20), asking(max_new_tokens=20, temperature=0.9, seed=5),
              asking(max_new_tokens=20, prompt_logprobs=0, logprobs=1)]
    outputs = run(engine, prompts, params)
    assert engine.num_preemptions > 0, "the KV budget was meant to force preemptions"
    for prompt, p, out in zip(prompts, params, outputs):
        assert len(out.token_ids) == 20
        check_output(hf, prompt, out.token_ids, out.logprobs, out.prompt_logprobs, p.logprobs, p.prompt_logprobs)


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("temperature", [0, 0.3])
def test_speculative_decoding_reports_hfs_logprobs_for_accepted_guesses(qwen3_pair, draft_folder, method,
                                                                         temperature):
    hf, model = qwen3_pair
    spec = SpeculativeConfig(method, 4, draft_folder if method == "draft" else None)
    config = EngineConfig(max_num_seqs=3, max_model_len=96, speculative=spec, **paged(model))
    engine = LLMEngine(model, ByteTokenizer(), config)
    repeats = [5, 6, 7, 8] * 5  # n-gram lookup finds something to guess
    prompts = [repeats, PROMPTS[0], repeats[:9] + [40]]
    outputs = run(engine, prompts, asking(max_new_tokens=16, temperature=temperature, seed=3))
    assert engine.speculative_metrics["accepted"] > 0, "some guesses must be accepted for the test to mean much"
    for prompt, out in zip(prompts, outputs):
        check_output(hf, prompt, out.token_ids, out.logprobs, out.prompt_logprobs, 5, 3)


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_stops_leave_exactly_one_logprob_per_token(qwen3_pair, spec):
    hf, model = qwen3_pair
    speculative = SpeculativeConfig("ngram", 4) if spec else None
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=4, max_model_len=96, speculative=speculative))
    prompt = [5, 6, 7, 8] * 4
    free = generate_with_cache(model, ByteTokenizer(), prompt, asking(max_new_tokens=24)).token_ids
    # stop on a printable byte the model emits in the middle, as a stop string and as a stop token
    middle = next(t for t in free[3:] if 32 <= t < 127)
    params = [asking(max_new_tokens=24, stop=(chr(middle),)), asking(max_new_tokens=24, stop_token_ids=(middle,)),
              asking(max_new_tokens=24, stop=(chr(middle),), include_stop_str_in_output=True)]
    outputs = run(engine, [prompt] * 3, params)
    cut = free.index(middle) + 1
    for p, out in zip(params, outputs):
        assert out.finish_reason == "stop" and out.token_ids == free[:cut], p
        assert len(out.logprobs) == len(out.token_ids)
        check_output(hf, prompt, out.token_ids, out.logprobs, out.prompt_logprobs, 5, 3)
    assert chr(middle) not in outputs[0].text and outputs[2].text.endswith(chr(middle))


# ---------------------------------------------------------------------------------------- the naive loops
@pytest.mark.parametrize("loop", [generate_with_cache, generate_without_cache])
def test_naive_loops_report_the_engines_logprobs(pair, loop):
    hf, model = pair
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=3, max_model_len=64, **paged(model)))
    params = [asking(), asking(temperature=1.0, seed=8, logprobs=2, prompt_logprobs=0),
              asking(temperature=0.7, top_p=0.9, seed=1, presence_penalty=1.0, logprobs=20, prompt_logprobs=20)]
    outputs = run(engine, PROMPTS, params)
    for prompt, p, out in zip(PROMPTS, params, outputs):
        naive = loop(model, ByteTokenizer(), prompt, p)
        assert naive.token_ids == out.token_ids
        check_output(hf, prompt, naive.token_ids, naive.logprobs, naive.prompt_logprobs, p.logprobs,
                     p.prompt_logprobs)
        for ours, theirs in zip(naive.logprobs, out.logprobs):
            assert ours.token_id == theirs.token_id and ours.rank == theirs.rank
            assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-5)
            assert [t for t, _ in ours.top] == [t for t, _ in theirs.top] or \
                all(a == pytest.approx(b, abs=1e-5) for (_, a), (_, b) in zip(ours.top, theirs.top))


def test_naive_loop_without_logprobs_reports_none(qwen3_pair):
    _, model = qwen3_pair
    out = generate_with_cache(model, ByteTokenizer(), [5, 6], SamplingParams(temperature=0, max_new_tokens=2))
    assert out.logprobs is None and out.prompt_logprobs is None


def test_token_logprobs_is_log_softmax_rank_and_top():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [5.0, -1.0, 0.0, 0.5]])
    first, second = token_logprobs(logits, [2, 0], [2, 0])
    expected = torch.log_softmax(logits, -1)
    assert first.logprob == pytest.approx(float(expected[0, 2])) and first.rank == 3  # two tokens above it
    assert [round(v, 5) for _, v in first.top] == [round(float(expected[0, 1]), 5)] * 2
    assert second.rank == 1 and second.top == ()
    assert token_logprobs(logits[:0], [], []) == []
    assert dataclasses.asdict(second)["token_id"] == 0
