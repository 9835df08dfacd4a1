"""A failing request fails alone: the engine attacked as a hostile or careless user would.

Hostile input at the door, faults injected into a step (the forward pass, the sampler, the
detokenizer, the scheduler), interrupts, cancellation, threads, and a seeded stress run through
AsyncLLM. After each test `tests/conftest.py` checks that no request, slot or KV block is held."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import random
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minillm.sampler
from minillm import LLM, AsyncLLM, EngineConfig, SamplingParams
from minillm.detokenizer import IncrementalDetokenizer
from minillm.engine import LLMEngine
from minillm.generate import generate_with_cache
from minillm.trace import Trace
from tests.hf_reference import ByteTokenizer
from tests.test_engine import _reference, paged_budget, requests_strategy

GREEDY = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
CONFIGS = {
    "static": EngineConfig(batching="static", max_num_seqs=3, max_model_len=64),
    "continuous": EngineConfig(max_num_seqs=3, max_model_len=64),
    "paged": EngineConfig(max_num_seqs=3, max_model_len=64, kv="paged", block_size=8),
}


def tiny_engine(model, kind: str = "paged", **overrides) -> LLMEngine:
    config = dataclasses.replace(CONFIGS[kind], **overrides)
    if config.kv == "paged" and config.kv_cache_bytes is None:
        config = dataclasses.replace(config, kv_cache_bytes=paged_budget(model, config.block_size, 12))
    return LLMEngine(model, ByteTokenizer(), config)


def tiny_llm(model, kind: str = "paged", **overrides) -> LLM:
    """An `LLM` around the tiny random model (LLM() itself would load a checkpoint)."""
    llm = LLM.__new__(LLM)
    llm.engine = tiny_engine(model, kind, **overrides)
    return llm


@functools.cache
def shipped_llm() -> LLM:
    return LLM(config=EngineConfig(kv="paged", max_num_seqs=4, max_model_len=256))


# ----------------------------------------------------------------------------- checks at the door
HOSTILE_PROMPTS = [
    ([1, 2, 5000], "token id 5000 at index 2 is outside the vocabulary [0, 256)"),
    ([7, -1], "token id -1 at index 1 is outside the vocabulary"),
    ([5, 6.0], "must be integers, got float 6.0 at index 1"),
    ([True, 6], "must be integers, got bool True at index 0"),
    (["5", "6"], "must be integers, got str '5' at index 0"),
    (b"abc", "must be a str or a list of token ids, got bytes"),
    (None, "must be a str or a list of token ids, got NoneType"),
    (5, "got int (one prompt of token ids is a list: [[5, 6, 7]]"),
    ({"text": "hi"}, "got dict"),
    ("ab\ud800c", "not valid Unicode text: surrogates not allowed at character 2"),
    ("", "prompt is empty"),
    ([], "prompt is empty"),
    ([5] * 64, "prompt has 64 tokens; the context holds 64"),
]


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize("bad, message", HOSTILE_PROMPTS, ids=[repr(p)[:24] for p, _ in HOSTILE_PROMPTS])
def test_a_hostile_prompt_is_its_own_error_and_the_call_is_served(model, kind, bad, message):
    llm = tiny_llm(model, kind)
    outs = llm.generate([[5, 6, 7], bad, [40, 41]], GREEDY, use_tqdm=False)
    assert outs[1].finish_reason == "error" and message in outs[1].error
    assert [outs[0].token_ids, outs[2].token_ids] == [_reference(model, (5, 6, 7), 12), _reference(model, (40, 41), 12)]
    assert len({o.request_id for o in outs}) == 3, "each request, refused or not, has its own id"
    assert not llm.engine.requests, "the call left requests behind"
    assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids == outs[0].token_ids


@pytest.mark.parametrize("bad, message", [
    ({"temperature": 0}, "params must be a SamplingParams, got dict"),
    ("greedy", "params must be a SamplingParams, got str"),
])
def test_params_that_are_not_sampling_params_are_that_requests_error(model, bad, message):
    llm = tiny_llm(model)
    outs = llm.generate([[5, 6, 7], [8, 9]], [GREEDY, bad], use_tqdm=False)
    assert outs[0].token_ids == _reference(model, (5, 6, 7), 12)
    assert outs[1].finish_reason == "error" and message in outs[1].error
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate([[5, 6, 7], [8, 9]], [GREEDY])
    with pytest.raises(ValueError, match="prompts must be"):
        llm.generate(None)


def test_the_issues_reproductions_on_the_shipped_model():
    """The out-of-vocabulary id, then a plain prompt: the second call is served as on a fresh engine."""
    llm = shipped_llm()
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    bad = llm.generate([[1, 2, 5000]], greedy, use_tqdm=False)[0]
    assert bad.finish_reason == "error" and "outside the vocabulary [0, 4096)" in bad.error
    mixed = llm.generate(["ROMEO:", "JULIET:", 5], greedy, use_tqdm=False)
    assert [o.finish_reason for o in mixed][2] == "error" and not llm.engine.requests
    tiny_temperature = llm.generate(["ROMEO:"], SamplingParams(temperature=1e-38, max_new_tokens=8), use_tqdm=False)
    assert tiny_temperature[0].token_ids == mixed[0].token_ids  # below SAMPLING_EPS: greedy, not NaN
    reference = generate_with_cache(llm.engine.model, llm.tokenizer, "ROMEO:", greedy)
    assert mixed[0].token_ids == reference.token_ids


def test_request_ids_arrival_times_and_configs_are_checked(model):
    engine = tiny_engine(model)
    user = engine.add_request([5, 6], GREEDY, request_id="0", arrival_time=0.0)
    assert user.arrival_time == 0.0, "an arrival time of 0.0 is a time, not a missing value"
    auto = engine.add_request([5, 6], GREEDY)
    assert auto.request_id != "0", "an automatic id must not collide with a user's"
    for request_id, message in [(5, "request_id must be a non-empty str"), ("", "non-empty str"),
                                ("0", "already in use")]:
        with pytest.raises(ValueError, match=message):
            engine.add_request([5, 6], GREEDY, request_id=request_id)
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([5, 6], GREEDY, arrival_time="now")
    while engine.has_unfinished():
        engine.step()
    for field, value in [("max_num_seqs", True), ("block_size", True), ("trace_max_steps", 0)]:
        with pytest.raises(ValueError, match=field):
            EngineConfig(**{field: value})
    with pytest.raises(ValueError, match="config must be an EngineConfig"):
        LLMEngine(model, ByteTokenizer(), {"kv": "paged"})


def test_start_up_refuses_a_kv_cache_larger_than_the_memory_available(model, monkeypatch):
    with pytest.raises(ValueError, match=r"the KV cache would take 1024.0 TiB \(.*\), but cpu has .* available"):
        LLMEngine(model, ByteTokenizer(), EngineConfig(kv="paged", kv_cache_bytes=2**50))
    monkeypatch.setattr("minillm.engine.available_bytes", lambda device: 2**20)
    with pytest.raises(ValueError, match=r"max_num_seqs=4096 x max_model_len=512 tokens x 1.0 KiB per token"):
        LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=4096))


def test_start_up_refuses_triton_where_it_cannot_run(model, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr("minillm.attention.triton_paged.unavailable_reason", lambda device: "no GPU driver here")
    with pytest.raises(ValueError, match="use_triton=True, but the Triton kernels cannot run here: no GPU driver"):
        tiny_engine(model, use_triton=True)


def test_without_the_interpreter_a_cpu_cannot_run_triton():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import torch; from minillm.attention.triton_paged import unavailable_reason; "
            "print(unavailable_reason(torch.device('cpu')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "Triton compiles its kernels for a GPU" in proc.stdout, proc.stderr


# ----------------------------------------------------------------------------- faults inside a step
def inject(engine: LLMEngine, fault) -> None:
    """Wrap the runner: `fault(step, output)` runs before every forward pass and may raise."""
    execute, steps = engine.runner.execute, iter(range(10**9))
    step_of_call = {"step": -1}
    engine_step = engine.step

    def counting_step():
        step_of_call["step"] = next(steps)
        return engine_step()

    def faulty_execute(output, *proposals):
        fault(step_of_call["step"], output)
        return execute(output, *proposals)

    engine.step, engine.runner.execute = counting_step, faulty_execute


PROMPTS = [(5, 6, 7), (40, 41), (90, 91, 92, 93)]


def serve(engine: LLMEngine, prompts=PROMPTS, params=GREEDY) -> dict[tuple, object]:
    ids = {p: engine.add_request(list(p), params).request_id for p in prompts}
    while engine.has_unfinished():
        engine.step()
    outputs = {p: engine.output(i) for p, i in ids.items()}
    for i in ids.values():
        engine.release(i)
    return outputs


@pytest.mark.parametrize("kind", CONFIGS)
def test_a_poisoned_request_fails_alone(model, kind):
    """The forward pass raises whenever one request is in the batch: the engine runs the step's
    requests one at a time, fails that one, and the others get exactly their tokens."""
    engine = tiny_engine(model, kind)

    def fault(step, output):
        if any(c.token_ids[0] == 40 and c.start == 0 for c in output.chunks):
            raise RuntimeError("kernel failure on request 40")

    inject(engine, fault)
    outputs = serve(engine)
    assert outputs[(40, 41)].finish_reason == "error"
    assert outputs[(40, 41)].error == "RuntimeError: kernel failure on request 40"
    for prompt in [(5, 6, 7), (90, 91, 92, 93)]:
        assert outputs[prompt].token_ids == _reference(model, prompt, 12)
    assert serve(engine, [(41, 40)])[(41, 40)].token_ids == _reference(model, (41, 40), 12)


@pytest.mark.parametrize("kind", CONFIGS)
def test_a_step_that_fails_for_everyone_ends_its_requests_and_the_engine_serves_on(model, kind):
    engine = tiny_engine(model, kind)

    def fault(step, output):
        if step == 3:
            raise RuntimeError("the device fell over")

    inject(engine, fault)
    outputs = serve(engine)
    failed = [p for p, o in outputs.items() if o.finish_reason == "error"]
    assert failed and all("the device fell over" in outputs[p].error for p in failed)
    for prompt, out in outputs.items():
        reference = _reference(model, prompt, 12)
        assert out.token_ids == (reference[: len(out.token_ids)] if prompt in failed else reference)
    assert {p: o.token_ids for p, o in serve(engine).items()} == {p: _reference(model, p, 12) for p in PROMPTS}


def test_a_transient_fault_costs_nobody_a_token(model):
    engine = tiny_engine(model, "paged")
    raised = []

    def fault(step, output):  # only the batched call of step 2 fails; the one-at-a-time retries pass
        if step == 2 and len(output.chunks) > 1:
            raised.append(step)
            raise MemoryError("out of memory for the whole batch")

    inject(engine, fault)
    outputs = serve(engine)
    assert raised == [2]
    assert {p: o.token_ids for p, o in outputs.items()} == {p: _reference(model, p, 12) for p in PROMPTS}


def test_a_sampler_that_raises_for_one_request_leaves_the_others_draws_unchanged(model, monkeypatch):
    params = {p: SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_new_tokens=12, ignore_eos=True)
              for s, p in zip((11, 13, 17), PROMPTS)}

    def run() -> dict[tuple, object]:
        engine = tiny_engine(model, "continuous")
        ids = {p: engine.add_request(list(p), sp).request_id for p, sp in params.items()}
        while engine.has_unfinished():
            engine.step()
        return {p: engine.output(i) for p, i in ids.items()}

    clean = run()
    draw = minillm.sampler.draw

    def poisoned(probs, generator):  # the batched sampler draws each row with its request's generator
        if generator.initial_seed() == 13:
            raise RuntimeError("probability tensor contains nan")
        return draw(probs, generator)

    monkeypatch.setattr(minillm.sampler, "draw", poisoned)
    faulty = run()
    assert faulty[PROMPTS[1]].finish_reason == "error" and "nan" in faulty[PROMPTS[1]].error
    for prompt in (PROMPTS[0], PROMPTS[2]):
        assert faulty[prompt].token_ids == clean[prompt].token_ids


def test_a_detokenizer_that_raises_fails_its_request_only(model):
    engine = tiny_engine(model, "continuous")
    ids = {p: engine.add_request(list(p), GREEDY).request_id for p in PROMPTS}
    engine.step()

    def broken(token_id):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    engine.detokenizers[ids[PROMPTS[0]]].push = broken
    while engine.has_unfinished():
        engine.step()
    assert engine.output(ids[PROMPTS[0]]).finish_reason == "error"
    for prompt in PROMPTS[1:]:
        assert engine.output(ids[prompt]).token_ids == _reference(model, prompt, 12)


@pytest.mark.parametrize("when", [0, 4])
def test_keyboard_interrupt_aborts_the_calls_requests(model, when):
    """The notebook's stop button: generate raises KeyboardInterrupt, and nothing stays behind."""
    llm = tiny_llm(model, "paged")

    def fault(step, output):
        if step == when:
            raise KeyboardInterrupt

    inject(llm.engine, fault)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([list(p) for p in PROMPTS], GREEDY, use_tqdm=False)
    assert not llm.engine.requests and not llm.engine.has_unfinished() and llm.engine.pool.is_idle
    again = llm.generate([list(p) for p in PROMPTS], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in again] == [_reference(model, p, 12) for p in PROMPTS]


def test_ctrl_c_during_a_step_lands_after_it_and_leaves_the_prefix_cache_sound(model):
    """A real SIGINT arriving mid-step (found by a probe: one landing inside the block pool's eviction left a
    block cached but neither held nor evictable, and every later hit on it failed) is held until the step
    ends; generate then raises KeyboardInterrupt with the books balanced."""
    import os
    import signal

    llm = tiny_llm(model, "paged", prefix_cache=True)
    shared = list(range(40, 72))
    llm.generate([shared + [1]], GREEDY, use_tqdm=False)  # cache the shared blocks
    finished_steps = []

    def ctrl_c(step, output):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the step is running
        finished_steps.append(step)

    inject(llm.engine, ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([shared + [2], shared + [3]], GREEDY, use_tqdm=False)
    assert finished_steps == [0, 1, 2]  # the interrupted step ran to its end, no further step began
    pool = llm.engine.pool
    assert not llm.engine.requests and pool.is_idle
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back
    again = llm.generate([shared + [4]], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens > 0 and again.token_ids == _reference(model, tuple(shared + [4]), 12)


def test_ctrl_c_in_a_hand_driven_step_loop_lands_after_the_step(model):
    """Notebooks drive engine.step() themselves: the interrupt waits for the step there too."""
    import os
    import signal

    engine = tiny_engine(model, "paged", prefix_cache=True)
    inject(engine, lambda step, output: os.kill(os.getpid(), signal.SIGINT) if step == 1 else None)
    request = engine.add_request([5, 6, 7, 8, 9], GREEDY)
    engine.step()
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert request.num_output_tokens == 2  # the interrupted step produced its token
    engine.abort(request.request_id)
    assert engine.pool.is_idle


def test_an_error_while_retiring_a_request_is_not_swallowed(model):
    """Found by a probe: an exception from the scheduler while it retired a finished request was caught as
    if the detokenizer had failed; generate returned "length" and the request kept its blocks forever."""
    llm = tiny_llm(model, "paged", prefix_cache=True)
    pool, free = llm.engine.pool, llm.engine.pool.free
    calls = []

    def free_fails_once(request_id):
        calls.append(request_id)
        if len(calls) == 1:
            raise RuntimeError("pool bookkeeping failed")
        free(request_id)

    pool.free = free_fails_once
    with pytest.raises(RuntimeError, match="bookkeeping"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert not llm.engine.requests and pool.is_idle  # generate's cleanup released it after all


def test_an_interrupt_inside_add_request_stays_an_interrupt(model, monkeypatch):
    """Found by a probe: Ctrl-C while a request was being stored surfaced as KeyError from the cleanup."""
    llm = tiny_llm(model, "paged")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("minillm.engine.IncrementalDetokenizer.for_request", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[5, 6, 7], [8, 9]], GREEDY, use_tqdm=False)
    assert not llm.engine.requests and not llm.engine.detokenizers and llm.engine.pool.is_idle


def test_a_request_that_cannot_be_admitted_into_an_idle_engine_fails_instead_of_hanging(model):
    """Found by a probe: with a block lost (there, to an exception mid-allocation), a request needing every
    block passed the door but was never admitted, and generate ran empty steps forever."""
    llm = tiny_llm(model, "paged")  # 12 blocks of 8 tokens
    lost = llm.engine.pool.take(6)  # 6 left; the prompt needs 7
    out = llm.generate([list(range(3, 53))], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.finish_reason == "error" and "could not be admitted" in out.error
    llm.engine.pool.decref(lost)
    assert llm.engine.pool.is_idle


# ----------------------------------------------------------------------------- stop precedence
def test_a_stop_on_the_last_allowed_token_reports_stop(model):
    """A stop string or stop token beats length when both land on the same token, as in chapter 1."""
    prompt = (5, 6, 7)
    reference = _reference(model, prompt, 12)
    # the last allowed token: printable ASCII (one character of text) that did not appear before it
    k = next(k for k in range(1, 12) if 32 <= reference[k] < 127 and reference[k] not in reference[:k])
    last = chr(reference[k])
    engine = tiny_engine(model, "continuous")
    for expected, extra in [("length", {}), ("stop", {"stop_token_ids": (reference[k],)}),
                            ("stop", {"stop": (last,)})]:
        params = SamplingParams(temperature=0, max_new_tokens=k + 1, ignore_eos=True, **extra)
        out = serve(engine, [prompt], params)[prompt]
        chapter_1 = generate_with_cache(model, ByteTokenizer(), list(prompt), params)
        assert out.finish_reason == chapter_1.finish_reason == expected, extra
        assert out.token_ids == chapter_1.token_ids == reference[: k + 1]
        assert out.text == chapter_1.text


def test_the_issues_stop_string_case_on_the_shipped_model():
    out = shipped_llm().generate(["ROMEO:"], SamplingParams(temperature=0, max_new_tokens=4, stop=[" I"]),
                                 use_tqdm=False)[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "stop" and " I" not in out.text


# ----------------------------------------------------------------------------- bounded trace
def test_the_trace_keeps_a_window_of_recent_steps(model):
    engine = tiny_engine(model, "continuous", trace_max_steps=5)
    serve(engine)
    trace = engine.trace
    assert len(trace.steps) == 5 and trace.num_dropped > 0
    assert [s.step for s in trace.steps] == list(range(trace.num_dropped, trace.num_dropped + 5))
    assert Trace.from_dict(trace.to_dict()) == trace
    assert len(tiny_engine(model, "continuous").trace.steps) == 0 and EngineConfig().trace_max_steps == 10_000


def test_the_trace_keeps_no_more_steps_than_fit_its_bytes(model):
    from minillm.trace import approx_bytes

    engine = tiny_engine(model, "paged", trace_max_bytes=4000)
    serve(engine)
    trace = engine.trace
    assert trace.num_dropped > 0 and 1 <= len(trace.steps) < 4000 // 300
    assert trace.num_bytes == sum(approx_bytes(s) for s in trace.steps) <= 4000
    assert [s.step for s in trace.steps] == list(range(trace.num_dropped, trace.num_dropped + len(trace.steps)))
    assert Trace.from_dict(trace.to_dict()) == trace
    tiny = tiny_engine(model, "paged", trace_max_bytes=1)  # a step bigger than the bound: the newest stays
    serve(tiny)
    assert len(tiny.trace.steps) == 1 and EngineConfig().trace_max_bytes == 64 << 20
    with pytest.raises(ValueError, match="trace_max_bytes"):
        EngineConfig(trace_max_bytes=0)


# ----------------------------------------------------------------------------- threads
def test_two_threads_share_one_llm(model):
    llm = tiny_llm(model, "paged")
    prompts = {name: [[5 + i, 6 + i, 40 + (name == "b")] for i in range(8)] for name in "ab"}
    results, errors = {}, []

    def call(name):
        try:
            results[name] = llm.generate(prompts[name], GREEDY, use_tqdm=False)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(name,)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and set(results) == {"a", "b"}
    for name in "ab":
        assert [o.token_ids for o in results[name]] == [_reference(model, tuple(p), 12) for p in prompts[name]]
    assert not llm.engine.requests


# ----------------------------------------------------------------------------- AsyncLLM
def test_async_refusals_and_cancellations_never_stop_the_loop(model):
    llm = AsyncLLM(engine=tiny_engine(model, "paged"))

    async def scenario():
        bad_type = llm.submit(5, GREEDY)
        cancelled_early = llm.submit("", GREEDY)
        cancelled_early.cancel()  # refused and cancelled: no InvalidStateError may reach the loop
        bad_id = llm.submit([5, 6], GREEDY, request_id=7)
        good = llm.submit([5, 6, 7], GREEDY)
        with pytest.raises(ValueError, match="got int"):
            await bad_type
        with pytest.raises(ValueError, match="request_id"):
            await bad_id
        first = await good
        later = await llm.submit([40, 41], GREEDY)
        return first, later

    first, later = asyncio.run(scenario())
    assert first.token_ids == _reference(model, (5, 6, 7), 12)
    assert later.token_ids == _reference(model, (40, 41), 12)


def test_async_loop_survives_a_scheduler_defect(model):
    engine = tiny_engine(model, "paged")
    llm = AsyncLLM(engine=engine)
    schedule = engine.scheduler.schedule
    calls = {"n": 0}

    def flaky_schedule():
        calls["n"] += 1
        if calls["n"] == 3:
            raise AssertionError("a defect not yet found")
        return schedule()

    engine.scheduler.schedule = flaky_schedule

    async def scenario():
        hit = [llm.submit(list(p), GREEDY) for p in PROMPTS]
        outs = await asyncio.gather(*hit)
        return outs, await llm.submit([40, 41], GREEDY)

    outs, later = asyncio.run(scenario())
    assert all(o.finish_reason == "error" and "a defect not yet found" in o.error for o in outs)
    assert later.token_ids == _reference(model, (40, 41), 12)


def steps_holding(engine: LLMEngine, request_id: str, since: int) -> int:
    """Steps numbered >= since in which `request_id` held a slot."""
    return sum(1 for s in engine.trace.steps if s.step >= since
               and any(slot is not None and slot.request_id == request_id for slot in s.slots))


@pytest.mark.parametrize("how", ["cancel", "wait_for", "stream", "abort"])
def test_cancelling_frees_the_requests_kv_within_one_step(model, how):
    engine = tiny_engine(model, "paged", kv_cache_bytes=paged_budget(model, 8, 40))
    llm = AsyncLLM(engine=engine)
    long = SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True)

    async def until_it_has_tokens(request_id, n=3):
        while request_id not in engine.requests or len(engine.requests[request_id].output_token_ids) < n:
            await asyncio.sleep(0.001)

    async def scenario():
        other = llm.submit([40, 41], GREEDY)
        if how == "stream":  # a consumer that stops reading: the stream is closed early
            async with contextlib.aclosing(llm.stream([5, 6, 7], long, request_id="victim")) as deltas:
                async for _ in deltas:
                    if len(engine.requests["victim"].output_token_ids) >= 3:
                        cancelled_at = engine.trace.next_step
                        break
        else:
            victim = llm.submit([5, 6, 7], long, request_id="victim")
            await until_it_has_tokens("victim")
            cancelled_at = engine.trace.next_step
            if how == "wait_for":  # a caller that gives up waiting
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(victim, timeout=0.001)
                cancelled_at = engine.trace.next_step
            elif how == "cancel":
                victim.cancel()
            else:
                llm.abort("victim")
        while "victim" in engine.requests:
            await asyncio.sleep(0.001)
        return cancelled_at, await other

    cancelled_at, other = asyncio.run(scenario())
    assert steps_holding(engine, "victim", cancelled_at) <= 1, "the cancelled request ran on"
    assert other.token_ids == _reference(model, (40, 41), 12)
    assert engine.pool.is_idle


def test_a_request_cancelled_before_admission_never_runs(model):
    engine = tiny_engine(model, "paged")
    llm = AsyncLLM(engine=engine)

    async def scenario():
        victim = llm.submit([5, 6, 7], GREEDY, request_id="victim")
        victim.cancel()
        return await llm.submit([40, 41], GREEDY)

    assert asyncio.run(scenario()).token_ids == _reference(model, (40, 41), 12)
    assert steps_holding(engine, "victim", 0) == 0


# ----------------------------------------------------------------------------- stress
@functools.cache
def _solo(model, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    return generate_with_cache(model, ByteTokenizer(), list(prompt), params).token_ids


def _solo_text(prompt: tuple[int, ...], tokens: tuple[int, ...]) -> str:
    detok = IncrementalDetokenizer(ByteTokenizer(), prompt)
    for token in tokens:
        detok.push(token)
    detok.flush()
    return detok.text


def test_stress_through_async_llm(model):
    """200 requests arriving at random, a quarter cancelled at random moments (future, abort, or a
    stream left early), on a pool small enough to preempt again and again."""
    rng = random.Random(2026)
    engine = tiny_engine(model, "paged", max_num_seqs=6, block_size=8,
                         kv_cache_bytes=paged_budget(model, 8, 10))
    llm = AsyncLLM(engine=engine)
    requests = [(tuple(rng.randrange(3, 256) for _ in range(rng.randint(1, 20))), rng.randint(1, 30),
                 rng.choice([None] * 3 + ["cancel", "abort", "stream"]), rng.randint(0, 20)) for _ in range(200)]

    async def one(i, prompt, n, cancel, after):
        params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
        rid = f"r{i}"
        if cancel == "stream":  # read `after` deltas, then close the stream
            text = ""
            async with contextlib.aclosing(llm.stream(list(prompt), params, request_id=rid)) as deltas:
                async for delta in deltas:
                    text += delta
                    if len(text) >= after:
                        break
            return rid, text
        future = llm.submit(list(prompt), params, request_id=rid)
        if cancel is not None:
            for _ in range(after):
                await asyncio.sleep(0.0005)
            if cancel == "cancel":
                future.cancel()
            else:
                llm.abort(rid)
        try:
            return rid, await future
        except asyncio.CancelledError:
            return rid, None

    async def scenario():
        tasks = []
        for i, (prompt, n, cancel, after) in enumerate(requests):
            tasks.append(asyncio.ensure_future(one(i, prompt, n, cancel, after)))
            for _ in range(rng.randint(0, 2)):
                await asyncio.sleep(0)
        return dict(await asyncio.gather(*tasks))

    outputs = asyncio.run(scenario())
    completed = mismatches = aborted = 0
    for i, (prompt, n, _, _) in enumerate(requests):
        out, solo = outputs[f"r{i}"], _solo(model, prompt, n)
        if isinstance(out, str):  # a stream: its text is the solo run's text, or a prefix if it was left early
            full = _solo_text(prompt, tuple(solo))
            mismatches += not full.startswith(out)
            completed, aborted = (completed + 1, aborted) if out == full else (completed, aborted + 1)
        elif out is None or out.finish_reason == "abort":
            aborted += 1
            if out is not None:
                mismatches += out.token_ids != solo[: len(out.token_ids)]
        else:
            completed += 1
            mismatches += out.token_ids != solo or out.finish_reason != "length"
    preemptions = sum(len(s.preempted) for s in engine.trace.steps)
    print(f"\nstress: {len(requests)} requests, {completed} completed, {aborted} aborted, {preemptions} preemptions, "
          f"{mismatches} mismatches, {engine.pool.num_blocks - engine.pool.num_free_blocks} blocks held afterwards")
    assert mismatches == 0 and completed + aborted == 200
    assert aborted >= 20 and preemptions >= 20, "the run was meant to abort and preempt often"
    assert engine.pool.is_idle and not engine.requests


# ----------------------------------------------------------------------------- found by a hostile-user probe
def test_cancelling_a_refused_duplicate_leaves_the_original_alone(model):
    llm = AsyncLLM(engine=tiny_engine(model))

    async def scenario():
        original = llm.submit([5, 6, 7], GREEDY, request_id="a")
        llm.submit([40, 41], GREEDY, request_id="a").cancel()
        return await original

    assert asyncio.run(scenario()).token_ids == _reference(model, (5, 6, 7), 12)


def test_a_retry_with_the_id_of_a_timed_out_request_is_served(model):
    llm = AsyncLLM(engine=tiny_engine(model))
    long = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)

    async def scenario():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(llm.submit([5, 6, 7], long, request_id="job"), timeout=0.01)
        return await llm.submit([40, 41], GREEDY, request_id="job")

    assert asyncio.run(scenario()).token_ids == _reference(model, (40, 41), 12)


def test_ids_of_the_wrong_type_are_refused_at_the_call(model):
    llm = AsyncLLM(engine=tiny_engine(model))

    async def scenario():
        good = llm.submit([5, 6, 7], GREEDY)
        with pytest.raises(ValueError, match="request_id must be a str"):
            llm.abort(["x"])
        bad = llm.submit([5, 6], GREEDY, request_id=["x"])
        bad.cancel()  # already refused: cancelling changes nothing
        auto = [llm.submit([40, 41], GREEDY, request_id="async-1"), llm.submit([40, 41], GREEDY),
                llm.submit([40, 41], GREEDY)]  # automatic ids step over "async-1"
        return await good, await asyncio.gather(*auto)

    good, auto = asyncio.run(scenario())
    assert good.token_ids == _reference(model, (5, 6, 7), 12)
    assert len({o.request_id for o in auto}) == 3 and all(o.finish_reason == "length" for o in auto)
    assert not tiny_engine(model).abort(["x"])  # the engine: an unknown id of any type is just unknown


def test_an_abandoned_event_loop_leaves_nothing_for_the_next(model):
    """An event loop stopped or closed mid-generation (its tasks never cancelled): the next loop
    reclaims what it left, no stale abort reaches a new request that reuses an id."""
    engine = tiny_engine(model)
    llm = AsyncLLM(engine=engine)
    long = SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True)

    async def leave_work_behind():
        llm.submit([5, 6, 7], long, request_id="q")
        llm.abort("q-not-yet")  # an abort still queued when the loop goes
        while "q" not in engine.requests or not engine.requests["q"].output_token_ids:
            await asyncio.sleep(0.001)

    async def again():
        return await llm.submit([5, 6, 7], GREEDY, request_id="q")

    loop = asyncio.new_event_loop()
    loop.run_until_complete(leave_work_behind())
    loop.close()
    assert asyncio.run(again()).token_ids == _reference(model, (5, 6, 7), 12)
    assert not engine.requests


def test_a_second_event_loop_in_another_thread_is_refused(model):
    engine = tiny_engine(model)
    llm = AsyncLLM(engine=engine)
    long = SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True)
    started, errors, outs = threading.Event(), [], []

    def first_loop():
        async def run():
            future = llm.submit([5, 6, 7], long)
            started.set()
            outs.append(await future)
        asyncio.run(run())

    thread = threading.Thread(target=first_loop)
    thread.start()
    started.wait(timeout=60)

    async def second():
        try:
            llm.submit([40, 41], GREEDY)
        except RuntimeError as err:
            errors.append(str(err))

    asyncio.run(second())
    thread.join(timeout=120)
    assert errors and "another thread" in errors[0]
    assert outs[0].token_ids == _reference(model, (5, 6, 7), 50)


def test_llm_and_async_llm_on_one_engine_do_not_steal_each_others_requests(model):
    llm = tiny_llm(model)
    allm = AsyncLLM(engine=llm.engine)

    async def scenario():
        future = allm.submit([5, 6, 7], GREEDY)
        while not llm.engine.requests:
            await asyncio.sleep(0.001)
        with llm.engine.lock:  # between two steps, for certain: the async request is in flight
            assert llm.engine.has_unfinished()
            with pytest.raises(RuntimeError, match="did not add"):
                llm.generate([[40, 41]], GREEDY, use_tqdm=False)
        return await future

    assert asyncio.run(scenario()).token_ids == _reference(model, (5, 6, 7), 12)
    assert llm.generate([[40, 41]], GREEDY, use_tqdm=False)[0].token_ids == _reference(model, (40, 41), 12)


def test_an_interrupt_while_outputs_are_collected_leaves_nothing_behind(model, monkeypatch):
    llm = tiny_llm(model)
    output = llm.engine.output

    def interrupted(request_id):  # the second output of the call is never collected
        if request_id != min(llm.engine.requests):
            raise KeyboardInterrupt
        return output(request_id)

    monkeypatch.setattr(llm.engine, "output", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([list(p) for p in PROMPTS[:2]], GREEDY, use_tqdm=False)
    assert not llm.engine.requests


def test_odd_values_at_the_door(model):
    llm = tiny_llm(model)
    with pytest.raises(ValueError, match="prompts must be a str or a list"):
        llm.generate(b"hi")
    engine = tiny_engine(model)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="arrival_time"):
            engine.add_request([5, 6], GREEDY, arrival_time=bad)


# ----------------------------------------------------------------------------- random workloads with faults
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=requests_strategy, kind=st.sampled_from(sorted(CONFIGS)),
       events=st.lists(st.tuples(st.integers(0, 25), st.sampled_from(["abort", "poison"]), st.integers(0, 7)),
                       max_size=4))
def test_random_aborts_and_poisoned_requests_never_change_anyone_elses_tokens(model, arrivals, kind, events):
    """Hypothesis-generated arrivals, with requests aborted or poisoned (every forward pass that
    holds them raises) at random steps: each such request ends alone, every other one keeps the
    naive loop's tokens, and nothing is held afterwards (tests/conftest.py)."""
    engine = tiny_engine(model, kind)
    poisoned: set[str] = set()

    def fault(step, output):
        if any(c.request_id in poisoned for c in output.chunks):
            raise RuntimeError("poisoned")

    inject(engine, fault)
    ids, pending, step = [], list(arrivals), 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= 0:  # arrivals due now
            _, prompt, n = pending.pop(0)
            params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
            ids.append((engine.add_request(prompt, params).request_id, tuple(prompt), n))
        for at, what, index in events:
            if at == step and index < len(ids):
                if what == "abort":
                    engine.abort(ids[index][0])
                else:
                    poisoned.add(ids[index][0])
        if engine.has_unfinished():
            engine.step()
        if pending:
            pending[0] = (pending[0][0] - 1, *pending[0][1:])
        step += 1
    hit = {ids[i][0] for at, _, i in events if i < len(ids)}
    for request_id, prompt, n in ids:
        out, reference = engine.output(request_id), _reference(model, prompt, n)
        if request_id in hit and out.finish_reason in ("abort", "error"):
            assert out.token_ids == reference[: len(out.token_ids)]
        else:
            assert out.token_ids == reference and out.finish_reason == "length", request_id
