"""Hostile clients against the server, over real HTTP: a stream that leaves while its request is
queued, a gigabyte sent with chunked transfer encoding, and a flood of large bodies while another
client streams. Each must cost the server little and lose nothing."""

import asyncio
import subprocess
import sys
import time

import httpx
import pytest

from minillm.async_engine import AsyncLLM
from minillm.engine import LLMEngine
from minillm.server import build_app
from minillm.server.body import MAX_BODY_BYTES
from tests.hf_reference import ByteTokenizer
from tests.test_server import MODEL, _config, _Server, scrape, wait_idle

ABORTED = 'minillm_requests_total{finish_reason="abort"}'


@pytest.fixture(scope="module")
def served(model):
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL, default_max_tokens=8))
    yield server, engine
    server.stop()


def test_a_stream_that_leaves_while_queued_is_aborted_and_counted(served):
    """It raised `RuntimeError: aclose(): asynchronous generator is already running` (the generator was
    closed while the cancelled wait for its first event was still inside it), and was never counted."""
    server, engine = served
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 100, "ignore_eos": True, "stream": True}
    before = scrape(server.url).get(ABORTED, 0)

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
            deadline = time.time() + 3  # the abort is applied between two steps, after it is counted
            while ((counted := scrape(server.url).get(ABORTED, 0)) < before + 1 or engine.scheduler.waiting) \
                    and time.time() < deadline:
                await asyncio.sleep(0.02)
            assert counted == before + 1, "the request that left the queue was not counted as aborted"
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


def test_a_chunked_gigabyte_is_refused_as_it_arrives_without_being_buffered(served):
    psutil = pytest.importorskip("psutil")
    server, engine = served
    process = psutil.Process()
    sent = 0

    def gigabyte():
        nonlocal sent
        piece = b"x" * (1 << 20)
        for _ in range(1024):
            sent += len(piece)
            yield piece

    def post_chunked(content) -> httpx.Response:  # a generator body: chunked, no Content-Length
        return httpx.post(server.url + "/v1/completions", content=content, timeout=30,
                          headers={"content-type": "application/json"})

    small = post_chunked(iter([b'{"model": "tiny", ', b'"prompt": [5, 6], "max_tokens": 2}']))
    assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] >= 1
    before, start = process.memory_info().rss, time.time()
    response = post_chunked(gigabyte())
    elapsed, grown = time.time() - start, process.memory_info().rss - before
    assert response.status_code == 413 and "more than this server takes" in response.json()["error"]["message"]
    assert sent < 64 * MAX_BODY_BYTES, f"the server read {sent >> 20} MiB before refusing"
    assert grown < 32 << 20, f"the server process grew by {grown >> 20} MiB"
    assert elapsed < 10
    assert httpx.get(server.url + "/health").status_code == 200
    wait_idle(engine)


FLOODER = r"""
import json, sys, httpx
url, kind = sys.argv[1], sys.argv[2]
size = 4_000_000
path, body = {
    "chat": ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x" * size}]}),
    "text": ("/v1/completions", {"model": "tiny", "prompt": "ROMEO " * (size // 6)}),
    "ids": ("/v1/completions", {"model": "tiny", "prompt": [5] * (size // 3)}),
}[kind]
raw = json.dumps(body).encode()
with httpx.Client(timeout=60) as http:
    while True:
        status = http.post(url + path, content=raw, headers={"content-type": "application/json"}).status_code
        assert status == 400, status
        print(status, flush=True)
"""


def stream_gaps(url: str, max_tokens: int) -> list[float]:
    """One greedy stream of `max_tokens` tokens: the seconds between its chunks."""
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    arrivals = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                arrivals.append(time.perf_counter())
    assert len(arrivals) >= max_tokens // 2
    return [b - a for a, b in zip(arrivals[:-1], arrivals[1:])]


def test_large_bodies_never_stall_another_clients_stream(served):
    """Three clients send ~4 MB bodies in a loop (a chat of 4 MB, a text prompt of 4 MB, a list of 1.3
    million token ids: each is read, parsed and refused) while a fourth streams: its longest wait
    between two chunks stays within 100 ms of its longest wait on a quiet server."""
    server, engine = served
    real_step = engine.step
    engine.step = lambda: time.sleep(0.005) or real_step()  # a stream of ~0.5 s, whatever the machine
    flooders = []
    try:
        stream_gaps(server.url, 8)  # warm up
        quiet = max(stream_gaps(server.url, 90))
        flooders = [subprocess.Popen([sys.executable, "-c", FLOODER, server.url, kind], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for kind in ("chat", "text", "ids")]
        for flooder in flooders:  # each has had one body refused: the flood is on
            assert flooder.stdout.readline().strip() == "400", flooder.stderr.read()
        flooded = stream_gaps(server.url, 90)
        assert all(flooder.poll() is None for flooder in flooders), "a flooder stopped: " + "".join(
            f.stderr.read() for f in flooders if f.poll() is not None)
    finally:
        del engine.step
        for flooder in flooders:
            flooder.kill()
            flooder.communicate(timeout=10)  # reaps it and closes its pipes
    assert max(flooded) <= quiet + 0.1, f"a chunk waited {max(flooded):.3f} s under the flood, {quiet:.3f} s without"
    wait_idle(engine)


def test_large_bodies_are_checked_as_small_ones_are(served):
    """Bodies over PROCESS_BODY_BYTES go through the helper process (minillm/server/parse_worker.py):
    the same 400s, naming the field."""
    url = served[0].url
    cases = [("/v1/completions", {"model": MODEL, "prompt": [5] * 300_000}, "prompt", "prompt has 300000 items"),
             ("/detokenize", {"tokens": [5] * 300_000}, "tokens", "tokens has 300000 items"),
             ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x" * 300_000}]},
              "messages", "characters: more than the context"),
             ("/v1/completions", {"model": MODEL, "prompt": "hi", "junk": "x" * 300_000}, "junk", "unknown field")]
    for path, body, param, words in cases:
        response = httpx.post(url + path, json=body, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert words in response.json()["error"]["message"]
    broken = httpx.post(url + "/v1/completions", content=b'{"prompt": "' + b"a" * 300_000, timeout=30)
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]


def test_the_parse_worker_answers_and_comes_back_after_dying():
    from minillm.server.parse_worker import ParseWorker

    async def scenario() -> list:
        worker = ParseWorker()
        try:
            answers = [await worker.parse(b'{"prompt": [1, 2, 3]}', 2), await worker.parse(b'{"a": [[1]]}', 2)]
            worker._process.kill()  # the helper dies, unnoticed: this body's exchange fails (the server then
            with pytest.raises((OSError, EOFError)):  # parses it in a thread)
                await worker.parse(b"[1]", 2)
            answers += [await worker.parse(b"[1", 2)]  # a new helper
            worker._process.kill()  # dies, and this time its death is noticed before the next body
            await asyncio.sleep(0.2)
            return answers + [await worker.parse(b'{"x": "y"}', 2)]
        finally:
            await worker.aclose()

    answers = asyncio.run(scenario())
    assert answers[:2] == [("too_many", "prompt", 3), ("ok", {"a": [[1]]})]
    assert answers[2][0] == "invalid" and answers[3] == ("ok", {"x": "y"})
