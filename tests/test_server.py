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
    return EngineConfig(max_num_seqs=4, max_model_len=128, kv="paged", block_size=8,
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
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
        assert chunks[-1].usage.completion_tokens == len(tokens) and not chunks[-1].choices
        plain = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in plain) == text  # OpenAI's default: no usage chunk, no empty choices
        assert all(c.usage is None for c in plain)
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
    ({"model": MODEL, "prompt": "hi", "n": 0}, 400, "n", "n must be an integer in [1, 128]"),
    ({"model": MODEL, "prompt": "hi", "n": 5}, 400, "n", "each in a batch slot"),
    ({"model": MODEL, "prompt": "hi", "stop": ["a"] * 5}, 400, "stop", "up to 4"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 21}, 400, "logprobs", "[0, 20]"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt", "non-empty"),
    ({"model": MODEL, "prompt": [1, -2]}, 400, "prompt", "token ids"),
    ({"model": MODEL, "prompt": "x" * 200}, 400, "prompt", "context of 128 tokens"),
    ({"model": MODEL, "prompt": [5] * 200, "stream": True}, 400, "prompt", "the context holds 128"),
    ({"model": MODEL, "prompt": "x" * 100, "max_tokens": 40}, 400, "max_tokens", "exceeds the context of 128"),
    ({"model": MODEL, "prompt": "x" * 10**5}, 400, "prompt", "100000 characters"),
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


def scrape(url: str) -> dict[str, float]:
    """The /metrics page as {sample name with its labels: value}."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_metrics_count_requests_tokens_and_show_the_kv_blocks(served, client):
    server, engine = served
    before = scrape(server.url)
    client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=6, temperature=0, extra_body={"top_k": 3})
    list(client.completions.create(model=MODEL, prompt=[5, 6], max_tokens=4, temperature=0, stream=True))
    wait_idle(engine)
    after = scrape(server.url)
    finished = sum(v for k, v in after.items() if k.startswith("minillm_requests_total{"))
    assert finished - sum(v for k, v in before.items() if k.startswith("minillm_requests_total{")) == 2
    assert after["minillm_prompt_tokens_total"] - before.get("minillm_prompt_tokens_total", 0) == 5
    assert after["minillm_kv_blocks_used"] == 0 and after["minillm_kv_blocks_total"] == engine.pool.num_blocks
    assert after["minillm_requests_running"] == 0 == after["minillm_requests_waiting"]
    assert after['minillm_time_to_first_token_seconds_bucket{le="+Inf"}'] == after[
        "minillm_time_to_first_token_seconds_count"] >= 2
    assert "minillm_preemptions_total" in after


def test_the_load_generator_measures_a_run_against_the_server(served):
    """minillm/loadgen.py against the test server: every request completes, and the figures hold
    together (TTFT within the run, one chunk per token at most, throughput = tokens / wall time)."""
    from minillm.loadgen import Slo, arrival_times, prompts_from_text, run_load, summarize

    server, engine = served
    prompts = prompts_from_text("to be or not to be, that is the question " * 20, 12, seed=1, min_chars=8,
                                max_chars=30)
    assert prompts == prompts_from_text("to be or not to be, that is the question " * 20, 12, seed=1, min_chars=8,
                                        max_chars=30)  # seeded
    import asyncio

    records, wall = asyncio.run(run_load(server.url + "/v1", MODEL, prompts, rate=50.0, max_tokens=8, seed=2,
                                         extra={"ignore_eos": True}, progress=False))
    summary = summarize(records, wall, Slo(ttft_s=30.0, tpot_s=30.0))
    assert summary["completed"] == 12 and summary["failed"] == 0 and summary["goodput"] > 0
    assert all(r.output_tokens == 8 and 1 <= len(r.chunk_times) <= 8 for r in records)
    assert all(0 < r.ttft <= wall for r in records)
    assert summary["output_token_throughput"] == pytest.approx(12 * 8 / wall)
    assert summary["ttft_s"]["p50"] <= summary["ttft_s"]["p99"]
    times = arrival_times(1000, rate=10.0, seed=3)
    assert times == sorted(times) and 80 < times[-1] < 120  # about 1000 / 10 s
    assert arrival_times(3, float("inf"), 0) == [0.0, 0.0, 0.0]
    wait_idle(engine)


MALFORMED = [  # (body or raw bytes, what the error must say)
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "n": 0}, "n must be"),
    ({"model": "nope", "prompt": "hi"}, "does not exist"),
    ({"model": MODEL}, "prompt must be"),
    ({"model": MODEL, "prompt": "x" * 200}, "context"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": -5}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream must be"),
    ({"model": MODEL, "prompt": "hi", "seed": 1.5}, "seed"),
    ({"model": MODEL, "prompt": [3, "a"]}, "token ids"),
    (b'{"model": "tiny", "prompt": ', "not valid JSON"),
]


async def _hammer(url: str, prompts: list[list[int]], expected: dict, n: int, seed: int) -> dict:
    """n requests, concurrently: 10% malformed, 10% leaving mid-stream, the rest valid (streaming or not)."""
    import asyncio
    import random

    rng = random.Random(seed)
    tally = {"valid": 0, "malformed": 0, "left": 0, "5xx": 0, "wrong": []}
    gate = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=120) as http:

        async def one(i: int) -> None:
            kind = rng.random()
            async with gate:
                if kind < 0.1:
                    body, words = MALFORMED[i % len(MALFORMED)]
                    response = await (http.post(url, content=body) if isinstance(body, bytes) else
                                      http.post(url, json=body))
                    tally["5xx"] += response.status_code >= 500
                    ok = 400 <= response.status_code < 500 and words in response.json()["error"]["message"]
                    tally["malformed"] += 1
                    if not ok:
                        tally["wrong"].append((body, response.status_code, response.text[:200]))
                    return
                prompt = prompts[i % len(prompts)]
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
                if kind < 0.2:  # a client that reads one event and leaves
                    async with http.stream("POST", url, json=body | {"stream": True}) as response:
                        async for line in response.aiter_lines():
                            if line.startswith("data: "):
                                break
                    tally["left"] += 1
                    return
                if kind < 0.6:
                    response = await http.post(url, json=body)
                    tally["5xx"] += response.status_code >= 500
                    text = response.json()["choices"][0]["text"] if response.status_code == 200 else None
                else:
                    text = ""
                    async with http.stream("POST", url, json=body | {"stream": True}) as response:
                        tally["5xx"] += response.status_code >= 500
                        async for line in response.aiter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                text += "".join(c.get("text", "") for c in json.loads(line[6:])["choices"])
                tally["valid"] += 1
                if text != expected[tuple(prompt)]:
                    tally["wrong"].append((prompt, text, expected[tuple(prompt)]))

        await asyncio.gather(*(one(i) for i in range(n)))
    return tally


def test_a_thousand_requests_with_malformed_ones_and_deserters(model, served):
    """The acceptance load: every valid request gets the offline engine's text, every malformed one its 4xx
    with the reason, no 5xx, the server stays up, and no KV block is held afterwards (read from /metrics)."""

    server, engine = served
    prompts = [[5 + i, 6, 7 + i % 5] for i in range(12)]
    expected = {tuple(p): offline(model, p, 12)[0] for p in prompts}
    check_acceptance_load(server.url, prompts, expected)
    wait_idle(engine)


def check_acceptance_load(url: str, prompts: list[list[int]], expected: dict) -> None:
    """1,000 requests (`_hammer`) at the server at `url`: no wrong text, no 5xx, enough of each kind, the
    server still healthy, and no KV block or running request left afterwards (read from /metrics)."""
    import asyncio

    tally = asyncio.run(_hammer(url + "/v1/completions", prompts, expected, n=1000, seed=7))
    assert not tally["wrong"], tally["wrong"][:3]
    assert tally["5xx"] == 0 and tally["valid"] > 700 and tally["malformed"] > 60 and tally["left"] > 60
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    deadline = time.time() + 20
    while (metrics := scrape(url))["minillm_kv_blocks_used"] or metrics["minillm_requests_running"]:
        assert time.time() < deadline, metrics
        time.sleep(0.1)


def test_a_client_that_leaves_a_non_streaming_request_aborts_it(served):
    """From the hostile probe: the request ran to its end, holding its slot and blocks (a middleware hid
    the disconnect). Now it is aborted within a poll, and /metrics counts it."""
    import asyncio

    server, engine = served
    before = scrape(server.url).get('minillm_requests_total{finish_reason="abort"}', 0)

    async def leave() -> None:
        async with httpx.AsyncClient() as http:
            body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 120, "ignore_eos": True}
            with pytest.raises(httpx.TimeoutException):
                await http.post(server.url + "/v1/completions", json=body, timeout=0.3)

    aborts = []
    real_abort, real_step = engine.abort, engine.step
    engine.abort = lambda request_id: aborts.append(request_id) or real_abort(request_id)
    engine.step = lambda: time.sleep(0.01) or real_step()  # 120 steps: over a second, whatever the machine
    try:
        asyncio.run(leave())
        wait_idle(engine, timeout=1)
    finally:
        del engine.abort, engine.step
    assert aborts, "the request ran to its end instead of being aborted"
    assert scrape(server.url)['minillm_requests_total{finish_reason="abort"}'] == before + 1


def test_a_client_that_leaves_while_queued_is_dropped_from_the_queue(served):
    import asyncio

    server, engine = served
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 100, "ignore_eos": True, "stream": True}

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            async def long_stream() -> None:
                async with http.stream("POST", server.url + "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass

            runners = [asyncio.create_task(long_stream()) for _ in range(4)]  # every slot taken
            while len(engine.scheduler.running) < 4:
                await asyncio.sleep(0.01)
            with pytest.raises(httpx.TimeoutException):  # a 5th stream waits in the queue, then leaves
                async with http.stream("POST", server.url + "/v1/completions", json=body, timeout=0.3):
                    pass
            deadline = time.time() + 2
            while engine.scheduler.waiting and time.time() < deadline:
                await asyncio.sleep(0.02)
            assert not engine.scheduler.waiting and len(engine.scheduler.running) == 4
            for runner in runners:
                runner.cancel()

    real_step = engine.step
    engine.step = lambda: time.sleep(0.01) or real_step()  # the four streams outlast the fifth's patience
    try:
        asyncio.run(go())
    finally:
        del engine.step
    wait_idle(engine)


def test_hostile_bodies_are_4xx_and_do_not_stall_the_server(served):
    """From the hostile probe: a number of 5,000 digits and deep nesting were 500s; a huge prompt was
    tokenized on the event loop, stalling every client for seconds."""
    url = served[0].url + "/v1/completions"
    for raw in (b'{"model": "tiny", "prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",
                b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 2000 + b"1" + b"}" * 2000):
        response = httpx.post(url, content=raw, timeout=30)
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    start = time.time()
    big = httpx.post(url, content=b'{"prompt": "' + b"a" * (5 << 20) + b'"}', timeout=30)
    assert big.status_code == 413 and "more than this server takes" in big.json()["error"]["message"]
    long_text = httpx.post(url, json={"model": MODEL, "prompt": "ROMEO " * 600_000}, timeout=30)
    assert long_text.status_code == 400 and "characters" in long_text.json()["error"]["message"]
    assert time.time() - start < 5
    missing = httpx.get(served[0].url + "/v1/nothing-here", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
