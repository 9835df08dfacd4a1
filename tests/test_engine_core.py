"""The engine core in its own process (minillm/engine_core/): the same tokens and text as LLM.generate,
AsyncLLM's API, and faults across the boundary (a core killed, a front end killed)."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minillm import LLM, EngineConfig, SamplingParams
from minillm.engine_core import ProcessAsyncLLM

CONFIG = EngineConfig(max_num_seqs=6, max_model_len=256, kv="paged", block_size=16, prefix_cache=True,
                      chunked_prefill=True, max_tokens_per_prefill_chunk=32)
PROMPTS = ["ROMEO:", "JULIET: O", "What is 1+1? Answer:", "First Citizen:\nBefore we proceed any further",
           "ROMEO:", [5, 6, 7, 8, 9], "KING HENRY:", "ROMEO: I"]
PARAMS = [SamplingParams(temperature=0, max_new_tokens=40),
          SamplingParams(temperature=0.8, seed=3, max_new_tokens=30, top_p=0.9),
          SamplingParams(temperature=0, max_new_tokens=40, stop=["\n"]),
          SamplingParams(temperature=1.0, seed=5, n=3, max_new_tokens=20, logprobs=2, stop=[" the", "e"]),
          SamplingParams(temperature=0, max_new_tokens=24, stop=["a"], include_stop_str_in_output=True,
                         min_tokens=4, prompt_logprobs=1),
          SamplingParams(temperature=0.7, seed=11, max_new_tokens=16, presence_penalty=0.5, repetition_penalty=1.2),
          SamplingParams(temperature=0, max_new_tokens=30, stop_token_ids=[198, 13]),
          SamplingParams(temperature=1.0, seed=2, n=2, max_new_tokens=12, stop=["\n\n"], top_k=20)]


@pytest.fixture(scope="module")
def core():
    llm = ProcessAsyncLLM(config=CONFIG, threads=1)
    yield llm
    llm.close()


def run(coroutine):
    return asyncio.run(coroutine)


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert condition()


def test_the_core_gives_llm_generates_tokens_text_and_logprobs(core):
    reference = LLM(config=CONFIG).generate(PROMPTS, PARAMS, use_tqdm=False)

    async def both():
        return await asyncio.gather(*(core.submit(p, q) for p, q in zip(PROMPTS, PARAMS)))

    for got, want in zip(run(both()), reference):
        assert got.prompt_token_ids == want.prompt_token_ids and got.prompt == want.prompt
        assert len(got.outputs) == len(want.outputs)
        for a, b in zip(got.outputs, want.outputs):
            assert (a.index, a.token_ids, a.text, a.finish_reason) == (b.index, b.token_ids, b.text, b.finish_reason)
            if b.logprobs is not None:
                assert [x.token_id for x in a.logprobs] == [x.token_id for x in b.logprobs]
                assert all(abs(x.logprob - y.logprob) < 1e-5 for x, y in zip(a.logprobs, b.logprobs))
        if want.prompt_logprobs is not None:
            assert [p and p.token_id for p in got.prompt_logprobs] == [p and p.token_id for p in want.prompt_logprobs]
    assert any(o.finish_reason == "stop" for r in reference for o in r.outputs), "no stop string was exercised"


def test_streams_carry_the_same_text_in_pieces_and_the_core_frees_everything(core):
    async def go():
        pieces = [d async for d in core.stream("ROMEO:", SamplingParams(temperature=0, max_new_tokens=30))]
        events = [e async for e in core.stream_events("JULIET:", SamplingParams(temperature=0.9, seed=4, n=2,
                                                                                   max_new_tokens=10, stop=["o"]))]
        await until(lambda: core.gauges().get("requests_running") == 0)
        return pieces, events

    pieces, events = run(go())
    want = LLM(config=CONFIG).generate(["ROMEO:", "JULIET:"], [
        SamplingParams(temperature=0, max_new_tokens=30),
        SamplingParams(temperature=0.9, seed=4, n=2, max_new_tokens=10, stop=["o"])], use_tqdm=False)
    assert "".join(pieces) == want[0].text and len(pieces) > 1
    final = events[-1].output
    assert [o.text for o in final.outputs] == [o.text for o in want[1].outputs]
    for index in (0, 1):
        assert "".join(e.delta for e in events[:-1] if e.index == index) == want[1].outputs[index].text
    gauges = core.gauges()
    assert gauges["requests_running"] == 0 and gauges["requests_waiting"] == 0
    assert gauges["kv_blocks_used"] == 0, "the core kept blocks no request holds"


def test_a_stop_string_stops_the_request_in_the_core_too(core):
    """A stop string found by the front end aborts the sample in the core: it does not run to max_tokens."""
    async def go():
        out = await core.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=200, stop=[" "],
                                                         ignore_eos=True))
        await until(lambda: core.gauges().get("requests_running") == 0, timeout=5)
        return out

    out = run(go())
    assert out.finish_reason == "stop" and " " not in out.text


def test_refusals_and_aborts_keep_asyncllms_contract(core):
    async def go():
        with pytest.raises(ValueError, match="context"):
            await core.submit("x" * 10_000, SamplingParams(max_new_tokens=4))
        with pytest.raises(ValueError, match="SamplingParams"):
            await core.submit("ROMEO:", {"temperature": 0})
        with pytest.raises(ValueError, match="max_num_seqs"):  # refused by the core, its reason carried back
            await core.submit("ROMEO:", SamplingParams(n=7, max_new_tokens=4))
        long = core.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True),
                           request_id="long")
        with pytest.raises(ValueError, match="already in use"):
            await core.submit("JULIET:", SamplingParams(max_new_tokens=4), request_id="long")
        await asyncio.sleep(0.3)
        core.abort("long")
        aborted = await long
        timed_out = core.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(timed_out, 0.3)
        again = await core.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=3), request_id="long")
        await until(lambda: core.gauges().get("requests_running") == 0, timeout=5)
        return aborted, again

    aborted, again = run(go())
    assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 200
    assert again.finish_reason == "length" and len(again.token_ids) == 3


def test_a_killed_core_ends_every_request_with_an_error_at_once():
    llm = ProcessAsyncLLM(config=EngineConfig(max_num_seqs=4, max_model_len=256), threads=1)
    try:
        async def go():
            stream = llm.stream("JULIET:", SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True))
            first = await anext(stream)
            futures = [llm.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True))
                       for _ in range(5)]  # three running beside the stream, two waiting
            await asyncio.sleep(0.2)
            os.kill(llm.core_pid, signal.SIGKILL)
            killed = time.monotonic()
            outs = await asyncio.wait_for(asyncio.gather(*futures), 2)
            with pytest.raises(RuntimeError, match="exit code -9"):
                async for _ in stream:
                    pass
            ended = time.monotonic() - killed
            with pytest.raises(RuntimeError, match="not running"):
                await llm.submit("ROMEO:", SamplingParams(max_new_tokens=2))
            return first, outs, ended

        first, outs, ended = run(go())
        assert first and ended < 2
        assert all(o.finish_reason == "error" and "exit code -9" in o.error for o in outs), [
            (o.finish_reason, o.error) for o in outs]
        assert llm.error is not None and "exit code -9" in llm.error
        assert not llm._live and not llm._core_id_of, "the front end kept requests of a dead core"
    finally:
        llm.close()


def test_a_killed_front_end_leaves_no_orphan_core(tmp_path):
    script = textwrap.dedent("""
        import asyncio, os, sys
        from minillm import EngineConfig, SamplingParams
        from minillm.engine_core import ProcessAsyncLLM
        llm = ProcessAsyncLLM(config=EngineConfig(max_num_seqs=2, max_model_len=128), threads=1)
        print(llm.core_pid, flush=True)
        async def busy():
            await llm.submit("ROMEO:", SamplingParams(max_new_tokens=100, ignore_eos=True))
        asyncio.run(asyncio.wait_for(busy(), 60))
    """)  # no `if __name__ == "__main__"` guard: the core is not started by multiprocessing's spawn
    front = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    core_pid = int(front.stdout.readline())
    time.sleep(0.5)
    front.kill()
    front.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(core_pid):
        time.sleep(0.05)
    assert not _alive(core_pid), "the engine core outlived its front end"


def test_a_core_that_cannot_start_says_why():
    with pytest.raises(ValueError, match="max_model_len"):
        ProcessAsyncLLM(config=EngineConfig(max_model_len=10**7))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_acceptance_load_through_the_process_split():
    """tests/test_server.py's acceptance load (1,000 requests: 10% malformed, 10% leaving mid-stream) against a
    server whose engine core is a process of its own: every valid text equals the offline engine's, no 5xx, and
    no KV block or running request is left afterwards."""
    from minillm.server import build_app
    from tests.test_server import MODEL, _Server, check_acceptance_load

    config = EngineConfig(max_num_seqs=8, max_model_len=128, kv="paged", block_size=16, trace_max_steps=64)
    prompts = [[5 + i, 6, 7 + i % 5] for i in range(12)]
    offline = LLM(config=config).generate(prompts, SamplingParams(temperature=0, max_new_tokens=12), use_tqdm=False)
    expected = {tuple(p): o.text for p, o in zip(prompts, offline)}
    llm = ProcessAsyncLLM(config=config)
    server = _Server(build_app(llm, MODEL, default_max_tokens=8))
    try:
        check_acceptance_load(server.url, prompts, expected)
    finally:
        server.stop()
        llm.close()
