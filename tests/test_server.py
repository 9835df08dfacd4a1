"""The OpenAI-compatible server (chapter 9), over real HTTP: the official `openai` client gets the
offline engine's tokens on completions and chat, streaming or not; bad requests get OpenAI-shaped
4xx errors naming the problem; a client that leaves mid-stream frees its request's KV blocks."""

import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.server import build_app
from minillm.server.chat_template import render_chat
from tests.hf_reference import ByteTokenizer
from tests.test_engine import paged_budget

MODEL = "tiny"


def _config(model) -> EngineConfig:
    return EngineConfig(max_num_seqs=4, max_model_len=64, kv="paged", block_size=8,
                        kv_cache_bytes=paged_budget(model, 8, 40))


class _Server:
    """uvicorn in a thread, on a free loopback port."""

    def __init__(self, app):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        assert self.server.started, "the test server did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def served(model):
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL, default_max_tokens=8))
    yield server, engine
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0)


def offline(model, prompt, n: int) -> tuple[str, list[int]]:
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    request = engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=n))
    while engine.has_unfinished():
        engine.step()
    out = engine.output(request.request_id)
    return out.text, out.token_ids


def wait_idle(engine: LLMEngine, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while (engine.has_unfinished() or not engine.pool.is_idle) and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.has_unfinished() and engine.pool.is_idle, "the server left a request or KV blocks behind"


def test_completions_give_the_offline_engines_tokens_streaming_or_not(model, served, client):
    for prompt in ("ROMEO: ", [5, 6, 7, 8]):
        text, tokens = offline(model, prompt, 12)
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        assert whole.choices[0].text == text and whole.usage.completion_tokens == len(tokens)
        assert whole.usage.prompt_tokens == (len(prompt.encode()) if isinstance(prompt, str) else len(prompt))
        assert whole.choices[0].finish_reason in ("stop", "length") and whole.object == "text_completion"
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
        assert chunks[-1].usage.completion_tokens == len(tokens) and not chunks[-1].choices
    wait_idle(served[1])


def test_chat_gives_the_offline_engines_tokens_streaming_or_not(model, served, client):
    messages = [{"role": "system", "content": "Answer in verse."}, {"role": "user", "content": "Who art thou?"}]
    prompt = render_chat(ByteTokenizer(), messages)
    assert prompt.endswith("USER:\nWho art thou?\n\nASSISTANT:\n") and prompt.startswith("SYSTEM:\n")
    text, tokens = offline(model, prompt, 10)
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    assert whole.choices[0].message.content == text and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == len(tokens)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    wait_idle(served[1])


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    ({"model": MODEL, "prompt": "hi", "temperature": 3}, 400, "temperature", "in [0.0, 2.0]"),
    ({"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p", "(0, 1]"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"model": MODEL, "prompt": "hi", "n": 2}, 400, "n", "n must be 1"),
    ({"model": MODEL, "prompt": "hi", "stop": ["a"] * 5}, 400, "stop", "up to 4"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 3}, 400, "logprobs", "not supported"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt", "non-empty"),
    ({"model": MODEL, "prompt": [1, -2]}, 400, "prompt", "token ids"),
    ({"model": MODEL, "prompt": "x" * 100}, 400, "prompt", "the context holds 64"),
    ({"model": MODEL, "prompt": "x" * 100, "stream": True}, 400, "prompt", "the context holds 64"),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model", "does not exist"),
    ({"prompt": "hi"}, 400, "model", "model must be"),
    ([1, 2], 400, None, "JSON object"),
])
def test_bad_requests_get_openai_shaped_errors(served, body, status, param, words):
    response = httpx.post(served[0].url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["param"] == param and error["type"]
    wait_idle(served[1])


def test_malformed_json_and_bad_chat_messages_are_400(served):
    response = httpx.post(served[0].url + "/v1/completions", content=b"{not json", timeout=30)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    for messages in ([], [{"role": "wizard", "content": "hi"}], [{"role": "user", "content": 5}]):
        response = httpx.post(served[0].url + "/v1/chat/completions", json={"model": MODEL, "messages": messages},
                              timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == "messages"


def test_health_and_models(served):
    assert httpx.get(served[0].url + "/health").json() == {"status": "ok"}
    models = httpx.get(served[0].url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_a_client_that_leaves_mid_stream_frees_its_request(served):
    server, engine = served
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 50, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "text_completion"
    wait_idle(engine)  # the disconnect aborted the request; its blocks are back in the pool


def test_an_api_key_is_required_when_the_server_has_one(model):
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL, api_key="sesame"))
    try:
        response = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
        keyed = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
        assert keyed.completions.create(model=MODEL, prompt="hi", max_tokens=3).usage.completion_tokens >= 1
        assert httpx.get(server.url + "/health").status_code == 200  # health needs no key
    finally:
        server.stop()
