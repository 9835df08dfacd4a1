"""The sampling parameters clients send, through the server and the official `openai` client: n
samples (greedy equal, seeded reproducible, streamed with their index), logprobs and top_logprobs
equal to Hugging Face transformers' log-softmax, echo with max_tokens 0 or 1 (what evaluation
harnesses send), the SDK's extra_body parameters honoured (each equal to the offline engine with the
same SamplingParams), and bad values refused with OpenAI-shaped 400s naming the parameter while a
stream beside them is served untouched."""

import threading

import httpx
import openai
import pytest
import torch

from minillm.async_engine import AsyncLLM
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.server import build_app
from tests.hf_reference import ByteTokenizer, make_checkpoint
from tests.test_server import MODEL, _config, _Server, wait_idle

PROMPT = [5, 6, 7, 8, 9, 10]  # ByteTokenizer: token id i is byte i


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """The Hugging Face model behind the `model` fixture (the same checkpoint: qwen3, seed 3)."""
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("hf-qwen3"), seed=3)


@pytest.fixture(scope="module")
def served(model):
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL, default_max_tokens=8))
    yield server, engine
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0)


def offline(model, prompt, params: SamplingParams) -> list[list[int]]:
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    request = engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    return [o.token_ids for o in engine.output(request.request_id).outputs]


def hf_log_softmax(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)  # (len, vocab)


def test_n_samples_greedy_equal_and_seeded_reproducible(client, served, model):
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.text for c in greedy.choices}) == 1
    assert greedy.usage.completion_tokens == 3 * 6
    seeded = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11, n=3,
                  extra_body={"ignore_eos": True})
    first, again = client.completions.create(**seeded), client.completions.create(**seeded)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1  # different samples, from seeds derived per sample
    expected = offline(model, PROMPT, SamplingParams(temperature=1.0, seed=11, n=3, max_new_tokens=8,
                                                     ignore_eos=True))
    assert [c.text for c in first.choices] == [ByteTokenizer().decode(t) for t in expected]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, n=2)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content == \
        chat.choices[1].message.content
    wait_idle(served[1])


def test_n_samples_stream_with_their_index(client, served):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=5, n=3,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**body)
    texts, finishes = {}, {}
    for chunk in client.completions.create(stream=True, **body):
        assert len(chunk.choices) == 1  # one choice per chunk, never an empty list without include_usage
        choice = chunk.choices[0]
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        if choice.finish_reason is not None:
            finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices} and finishes == {0: "length", 1: "length", 2: "length"}
    roles = [c.choices[0].index for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, stream=True)
        if c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1]
    wait_idle(served[1])


def test_logprobs_equal_transformers_log_softmax(client, served, model, hf_model):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    logprobs = out.choices[0].logprobs
    tokens = offline(model, PROMPT, SamplingParams(temperature=0, max_new_tokens=5))[0]
    assert logprobs.tokens == [ByteTokenizer().decode([t]) for t in tokens]
    reference = hf_log_softmax(hf_model, PROMPT + tokens)
    for i, (token, value, top) in enumerate(zip(tokens, logprobs.token_logprobs, logprobs.top_logprobs)):
        row = reference[len(PROMPT) - 1 + i]
        assert value == pytest.approx(float(row[token]), abs=1e-4)
        assert max(top.values()) == pytest.approx(float(row.max()), abs=1e-4)  # greedy: the chosen is the best
        ascii_best = [(t, v) for t, v in zip(*torch.topk(row, 3)) if 32 <= t < 127]  # named apart by their text
        for token_id, logprob in ascii_best:
            assert top[chr(int(token_id))] == pytest.approx(float(logprob), abs=1e-4)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    items = chat.choices[0].logprobs.content
    assert len(items) == 3 and all(len(item.top_logprobs) == 2 for item in items)
    assert items[0].top_logprobs[0].logprob >= items[0].top_logprobs[1].logprob
    wait_idle(served[1])


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_gives_the_prompts_logprobs_as_evaluation_harnesses_ask(served, hf_model, max_tokens):
    """lm-eval-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 1 (or 0)."""
    body = {"model": MODEL, "prompt": [PROMPT], "max_tokens": max_tokens, "logprobs": 1, "echo": True,
            "temperature": 0, "seed": 1234}
    answer = httpx.post(served[0].url + "/v1/completions", json=body, timeout=30).json()
    logprobs = answer["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(PROMPT) + max_tokens
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    reference = hf_log_softmax(hf_model, PROMPT)
    for j in range(1, len(PROMPT)):
        assert logprobs["token_logprobs"][j] == pytest.approx(float(reference[j - 1, PROMPT[j]]), abs=1e-4)
        top = logprobs["top_logprobs"][j]
        assert max(top.values()) == pytest.approx(float(reference[j - 1].max()), abs=1e-4)
    assert answer["usage"]["completion_tokens"] == max_tokens
    assert answer["choices"][0]["text"].startswith(ByteTokenizer().decode(PROMPT))
    wait_idle(served[1])


def test_vllm_prompt_logprobs_field(served, hf_model):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 2, "temperature": 0}
    entries = httpx.post(served[0].url + "/v1/completions", json=body, timeout=30).json()["choices"][0][
        "prompt_logprobs"]
    reference = hf_log_softmax(hf_model, PROMPT)
    assert entries[0] is None and len(entries) == len(PROMPT)
    for j in range(1, len(PROMPT)):
        own = entries[j][str(PROMPT[j])]
        assert own["logprob"] == pytest.approx(float(reference[j - 1, PROMPT[j]]), abs=1e-4)
        assert own["rank"] == int((reference[j - 1] > reference[j - 1, PROMPT[j]]).sum()) + 1
    wait_idle(served[1])


EXTRA = [({"top_k": 3}, dict(top_k=3)), ({"min_p": 0.2}, dict(min_p=0.2)),
         ({"repetition_penalty": 1.8}, dict(repetition_penalty=1.8)),
         ({"presence_penalty": 1.5, "frequency_penalty": 1.0}, dict(presence_penalty=1.5, frequency_penalty=1.0)),
         ({"logit_bias": {"50": 100}}, dict(logit_bias={50: 100.0})),
         ({"min_tokens": 6, "stop_token_ids": [51]}, dict(min_tokens=6, stop_token_ids=(51,)))]


@pytest.mark.parametrize("extra, params", EXTRA, ids=[next(iter(e)) for e, _ in EXTRA])
def test_extra_body_parameters_are_honoured(client, served, model, extra, params):
    """Each parameter gives exactly the offline engine's tokens with the same SamplingParams — seeded
    sampling at temperature 1, where every one of them changes what is drawn."""
    base = SamplingParams(temperature=1.0, seed=3, max_new_tokens=10, ignore_eos=True)
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=3,
                                       extra_body={"ignore_eos": True} | extra)
    expected = offline(model, PROMPT, SamplingParams(**{**base.__dict__, **params}))[0]
    assert answer.choices[0].text == ByteTokenizer().decode(expected)
    if "logit_bias" in extra:
        assert set(expected) == {50}  # a +100 bias: nothing else is ever drawn
    wait_idle(served[1])


BAD = [({"n": 0}, "n"), ({"n": 10_000}, "n"), ({"logprobs": 21}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
       ({"logit_bias": {"9999": 1}}, "logit_bias"), ({"logit_bias": {"5": 1e9}}, "logit_bias"),
       ({"logit_bias": {"x": 1}}, "logit_bias"), ({"presence_penalty": 2.5}, "presence_penalty"),
       ({"frequency_penalty": -99}, "frequency_penalty"), ({"repetition_penalty": -3}, "repetition_penalty"),
       ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 7}, "min_p"), ({"min_tokens": -1}, "min_tokens"),
       ({"min_tokens": 99}, "min_tokens"), ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"echo": 1}, "echo"),
       ({"max_tokens": 0}, "max_tokens"), ({"skip_special_tokens": "no"}, "skip_special_tokens")]


def test_bad_values_are_refused_by_name_and_a_stream_beside_them_is_untouched(served, model):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True, "ignore_eos": True}
    streamed: list[str] = []

    def stream() -> None:
        with httpx.stream("POST", served[0].url + "/v1/completions", json=body, timeout=60) as response:
            streamed.extend(line for line in response.iter_lines() if line.startswith("data: {"))

    worker = threading.Thread(target=stream)
    worker.start()
    for extra, param in BAD:
        path, request = "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}
        if param == "top_logprobs":
            path, request = "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(served[0].url + path, json=request | extra, timeout=30)
        assert response.status_code == 400, (extra, response.text)
        assert response.json()["error"]["param"] == param, (extra, response.json())
    worker.join(timeout=60)
    import json

    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in streamed)
    expected = offline(model, PROMPT, SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True))[0]
    assert text == ByteTokenizer().decode(expected)
    wait_idle(served[1])
