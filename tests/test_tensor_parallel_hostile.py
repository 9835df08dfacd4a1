"""Tensor parallelism attacked (chapter 13): sizes of every type, int4 groups a rank's shard cannot hold, engines
closed in the order they were made, closed engines kept alive, a rank failing half-way through a step, a worker
raising inside its forward pass, rank 0 killed while its workers load, Ctrl-C, the other EngineConfig options and
per-rank int8 scales.

Each of these once broke something: an int4 group size accepted by TP=1 and refused only by a worker process
(a WorkerLost, after every worker had started), torch's threads left cut after two engines closed first-in
first-out, a closed engine holding 14 file descriptors, a rank-0 failure taking the 5 s kill timeout (its
workers waited in a collective until killed), a closed engine saying its worker had "exited", and rank 0
killed while its workers loaded leaving the whole model in /dev/shm."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import gc
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.distributed import executor
from minillm.distributed.sharding import check_shardable
from minillm.engine import LLM, EngineStopped, LLMEngine
from minillm.generate import generate_with_cache
from minillm.model import load_model
from minillm.quantization.formats import quantize_int8
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer, make_checkpoint

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)
PROMPTS = [list(range(30, 53)), list(range(60, 100)), [11, 12, 13], [200, 9]]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def _fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


@pytest.fixture(scope="module", autouse=True)
def no_orphans():
    """No worker outlives this module's engines."""
    before = _children()
    yield
    gc.collect()
    deadline = time.monotonic() + 10
    while (left := _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-tp")
    make_checkpoint("qwen3", folder, seed=7, num_key_value_heads=1)  # 4 heads, 1 KV head (replicated), MLP 96
    return folder


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_model(checkpoint)


def tp_llm(model, **config) -> LLM:
    llm = object.__new__(LLM)
    llm.engine = LLMEngine(model, ByteTokenizer(), EngineConfig(**config))
    return llm


def outputs(llm: LLM, params: SamplingParams, prompts=PROMPTS) -> list[tuple]:
    """Every sample's tokens and finish reason, the error, and the logprobs and prompt logprobs of each request."""
    def values(entries):
        return None if entries is None else [float("nan") if e is None else e.logprob for e in entries]

    return [([o.token_ids for o in out.outputs], [o.finish_reason for o in out.outputs], out.error,
             [values(o.logprobs) for o in out.outputs], values(out.prompt_logprobs))
            for out in llm.generate(prompts, params, use_tqdm=False)]


def assert_same(got: list[tuple], want: list[tuple]) -> None:
    """The same tokens, finish reasons and errors; the same logprobs but for the all-reduce's order of addition."""
    assert [g[:3] for g in got] == [w[:3] for w in want]
    for g, w in zip(got, want):
        for mine, theirs in [*zip(g[3], w[3]), (g[4], w[4])]:
            assert (mine is None) == (theirs is None)
            if mine is not None:
                torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), atol=1e-3, rtol=0,
                                           equal_nan=True)


# ---------------------------------------------------------------------------- sizes, refused before any process
def test_sizes_of_the_wrong_type_or_range_are_refused_and_numpy_integers_taken():
    for bad in (True, False, 2.0, 1.5, "2", None, 0, -1, 65):
        with pytest.raises(ValueError, match="tensor_parallel_size must be an integer in"):
            EngineConfig(tensor_parallel_size=bad)
    config = EngineConfig(tensor_parallel_size=np.int64(2))
    assert type(config.tensor_parallel_size) is int and config.tensor_parallel_size == 2


def test_models_the_ranks_cannot_share_are_refused_by_name_before_a_worker_starts(model):
    config = model.config  # 4 heads, 1 KV head, 96 MLP rows, head_dim 32 (o_proj: 128 inputs)
    with pytest.raises(ValueError, match="4 attention heads"):
        check_shardable(config, 8)  # more ranks than heads
    with pytest.raises(ValueError, match="98 rows"):
        check_shardable(dataclasses.replace(config, intermediate_size=98), 4)
    check_shardable(dataclasses.replace(config, vocab_size=250), 4)  # the vocabulary is padded instead
    before = _children()
    began = time.monotonic()
    # int4 in groups of 32: TP=1's down_proj has 96 inputs (3 groups); a rank of 2 holds 48. Was: accepted, every
    # worker started, and a WorkerLost (a RuntimeError) from the workers' own quantize_model
    with pytest.raises(ValueError, match=r"quantization_group_size=32 must divide the 48 inputs .* down_proj"):
        LLMEngine(model, None, EngineConfig(tensor_parallel_size=2, kv="paged", quantization="int4",
                                            quantization_group_size=32), detokenize=False)
    assert time.monotonic() - began < 1.0 and _children() == before  # no worker was started
    with pytest.raises(ValueError, match="must divide the 64 inputs .* qkv_proj"):  # hidden 64: TP=1 refuses too
        check_shardable(config, 2, "int4", 128)
    check_shardable(config, 2, "int8", 128)  # int8 has no groups


# ---------------------------------------------------------------------------- lifecycle
def test_two_engines_at_once_then_closed_first_in_first_out_give_the_threads_back(model, tmp_path):
    """Two TP engines in one process (their own groups and stores) serve side by side; however they are closed,
    the process ends with the threads it had. Was: each gave back what it found, so closing the first engine
    first left the second one's cut (1 thread of 2) in place for good."""
    torch.set_num_threads(2)
    other_folder = tmp_path / "llama"
    make_checkpoint("llama", other_folder, seed=3, num_key_value_heads=4)
    other = load_model(other_folder)
    first = LLMEngine(model, None, EngineConfig(tensor_parallel_size=2, kv="paged"), detokenize=False)
    second = LLMEngine(other, None, EngineConfig(tensor_parallel_size=2), detokenize=False)
    try:
        first.add_request([5, 6, 7], GREEDY, request_id="x")
        second.add_request([5, 6, 7], GREEDY, request_id="x")
        while first.has_unfinished() or second.has_unfinished():  # their steps interleave
            for engine in (first, second):
                if engine.has_unfinished():
                    engine.step()
        assert first.output("x").token_ids == generate_with_cache(model, ByteTokenizer(), [5, 6, 7], GREEDY).token_ids
        assert second.output("x").token_ids == generate_with_cache(other, ByteTokenizer(), [5, 6, 7],
                                                                   GREEDY).token_ids
        first.release("x")
        second.release("x")
    finally:
        first.close()
        second.close()
    assert torch.get_num_threads() == 2


def test_a_closed_engine_kept_alive_holds_no_sockets_nor_weights_and_says_it_was_closed(model):
    """A notebook keeps `llm` after `close()`, or a loop keeps its engines: was 14 file descriptors each (the
    group's and the store's sockets, the workers' pipes) for as long as the object lived, and a later call said
    "tensor-parallel worker 1 exited (exit code 0)"."""
    before, threads = _fds(), torch.get_num_threads()
    kept = []
    for _ in range(2):
        llm = tp_llm(model, tensor_parallel_size=2, kv="paged")
        assert outputs(llm, GREEDY, [[1, 2, 3]])[0][2] is None
        llm.engine.close()
        kept.append(llm)
        assert not os.path.exists(llm.engine.workers._weights_dir)  # the weights file in /dev/shm is gone
    assert _fds() <= before + 2  # (torch may open a file of its own once)
    assert torch.get_num_threads() == threads
    with pytest.raises(EngineStopped, match="the engine was closed"):
        kept[0].engine.add_request([1, 2], GREEDY)
    assert kept[1].generate([[1, 2]], GREEDY, use_tqdm=False)[0].error == "the engine has stopped: the engine was " \
                                                                          "closed"


# ---------------------------------------------------------------------------- faults
def test_rank0_failing_half_way_through_a_step_stops_the_engine_without_waiting_to_kill(model):
    """Rank 0's pass raises between two all-reduces (an out-of-memory, a defect): its worker is left inside the
    next collective. Was: it waited there until the 5 s shutdown grace ran out and was killed; now rank 0's end
    of the group is closed first, the worker sees its peer leave and exits by itself."""
    llm = tp_llm(model, tensor_parallel_size=2, kv="paged")
    layer = llm.engine.model.layers[1]
    forward, calls = layer.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("rank 0 ran out of memory")
        return forward(*args, **kwargs)

    layer.forward = failing
    worker = llm.engine.workers.processes[0]
    began = time.monotonic()
    with pytest.raises(EngineStopped, match="rank 0 ran out of memory"):
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert time.monotonic() - began < 4.5
    assert worker.returncode is not None and worker.returncode != -signal.SIGKILL, "the worker had to be killed"


def _faulty_worker() -> None:
    """A worker process (`python -c ...`) whose forward pass raises on its second step."""
    from minillm.distributed import worker

    real, steps = worker.forward_logits, []

    def forward_logits(*args):
        steps.append(1)
        if len(steps) == 2:
            raise RuntimeError("this rank's kernel failed")
        return real(*args)

    worker.forward_logits = forward_logits
    worker.main(int(sys.argv[1]), int(sys.argv[2]))


def test_a_worker_raising_inside_its_forward_pass_stops_the_engine_with_its_error(model, monkeypatch):
    popen = subprocess.Popen

    def faulty(args, **kwargs):  # the worker's command, its own code swapped for _faulty_worker
        code = "from tests.test_tensor_parallel_hostile import _faulty_worker; _faulty_worker()"
        return popen([args[0], "-c", code, *args[3:]], cwd=os.path.dirname(os.path.dirname(__file__)), **kwargs)

    monkeypatch.setattr(executor.subprocess, "Popen", faulty)
    llm = tp_llm(model, tensor_parallel_size=2, kv="paged")
    began = time.monotonic()
    with pytest.raises(EngineStopped, match="worker 1 failed: RuntimeError: this rank's kernel failed"):
        llm.generate([[1, 2, 3], [4, 5]], GREEDY, use_tqdm=False)
    assert time.monotonic() - began < 10
    assert not llm.engine.has_unfinished() and llm.engine.pool.is_idle


def _slow_worker() -> None:
    """A worker process (`python -c ...`) that takes 3 s to read its shard."""
    from minillm.distributed import worker

    build_shard = worker.build_shard

    def slowly(*args):
        time.sleep(3)
        return build_shard(*args)

    worker.build_shard = slowly
    worker.main(int(sys.argv[1]), int(sys.argv[2]))


def test_rank0_killed_while_its_workers_load_leaves_no_copy_of_the_model_in_shared_memory(tmp_path):
    """The whole model is written to /dev/shm for the workers to read their slices; rank 0 deletes it once they
    have. Killed before (the OOM killer, loading a large model), it left the file — a copy of the model held in
    memory until the machine restarts. Now a worker that finds rank 0 gone deletes it."""
    folder = tmp_path / "model"
    make_checkpoint("qwen3", folder, seed=7, num_key_value_heads=1)
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, tempfile
        from minillm.config import EngineConfig
        from minillm.distributed import executor
        from minillm.engine import LLMEngine
        from minillm.model import load_model
        popen, mkdtemp = subprocess.Popen, tempfile.mkdtemp
        code = "from tests.test_tensor_parallel_hostile import _slow_worker; _slow_worker()"
        executor.subprocess.Popen = lambda args, **kwargs: popen([args[0], "-c", code, *args[3:]], **kwargs)
        def said(**kwargs):
            folder = mkdtemp(**kwargs)
            print(folder, flush=True)
            return folder
        executor.tempfile.mkdtemp = said
        LLMEngine(load_model({str(folder)!r}), None, EngineConfig(tensor_parallel_size=4), detokenize=False)
    """))
    root = os.path.dirname(os.path.dirname(__file__))
    rank0 = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=root,
                             env={**os.environ, "PYTHONPATH": root})
    weights = rank0.stdout.readline().strip()
    assert os.path.basename(weights).startswith("minillm-tp-")
    try:
        deadline = time.monotonic() + 30
        while len(workers := psutil.Process(rank0.pid).children()) < 3:  # started: they read their shards for 3 s
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rank0.kill()
        rank0.wait()
        assert os.path.exists(weights)
        psutil.wait_procs(workers, timeout=20)
        assert not os.path.exists(weights), "the model's copy outlived its engine"
    finally:
        rank0.kill()
        shutil.rmtree(weights, ignore_errors=True)  # not left in memory by a failing run either


def test_ctrl_c_during_generate_is_held_to_the_end_of_the_step_and_the_ranks_carry_on(model):
    llm = tp_llm(model, tensor_parallel_size=2, kv="paged")
    try:
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            llm.generate([[1, 2, 3]] * 3, SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True),
                         use_tqdm=False)
        timer.join()
        assert llm.engine.workers.alive() and not llm.engine.has_unfinished()
        assert outputs(llm, GREEDY, [[1, 2, 3]])[0][0] == [generate_with_cache(model, ByteTokenizer(), [1, 2, 3],
                                                                               GREEDY).token_ids]
    finally:
        llm.engine.close()


def test_async_requests_cancelled_aborted_and_timed_out_on_a_tp_engine_free_every_block(model):
    """AsyncLLM over a TP=2 engine with a small prefix cache: submissions at random moments, half of them aborted
    or cancelled, a stream left early, a timeout — the others equal TP=1's, nothing is left on any rank."""
    config = dict(kv="paged", block_size=4, prefix_cache=True, max_num_seqs=4, kv_cache_bytes=48 * 4 * 1024)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randrange(1, 40))] for _ in range(16)]
    params = [SamplingParams(temperature=0.7, seed=i, max_new_tokens=rng.randrange(1, 30), n=rng.choice([1, 2]))
              for i in range(16)]
    expected = tp_llm(model, **config).generate(prompts, params, use_tqdm=False)
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(tensor_parallel_size=2, **config))
    llm = AsyncLLM(engine=engine)

    async def scenario():
        futures, ended = [], set()
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            futures.append(llm.submit(prompt, p, request_id=f"r{i}"))
            await asyncio.sleep(rng.random() * 0.02)
            if rng.random() < 0.25:
                ended.add(j := rng.randrange(0, i + 1))
                llm.abort(f"r{j}")
            elif rng.random() < 0.25:
                ended.add(j := rng.randrange(0, i + 1))
                futures[j].cancel()
        async for _ in llm.stream([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=50)):
            break  # left early: aborted
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(llm.submit([1, 2, 3], SamplingParams(max_new_tokens=100, ignore_eos=True)), 0.2)
        outs = await asyncio.gather(*futures, return_exceptions=True)
        for i, (out, want) in enumerate(zip(outs, expected)):
            if i not in ended or (not isinstance(out, BaseException) and out.finish_reason != "abort"):
                assert [o.token_ids for o in out.outputs] == [o.token_ids for o in want.outputs]
        await asyncio.sleep(0.2)  # the timed-out request's abort is applied between steps

    try:
        asyncio.run(scenario())
        with engine.lock:
            assert not engine.has_unfinished() and engine.pool.is_idle and engine.workers.alive()
    finally:
        engine.close()


# ---------------------------------------------------------------------------- with the other options
def test_sampling_logprobs_a_quantized_cache_and_a_draft_model_equal_tp1s(model, checkpoint):
    """Seeded n > 1 samples, logprobs and prompt logprobs on a prefix cache with preemptions; int8 K/V up to
    max_model_len; a draft model (rank 0's alone: the target itself, so that most guesses are kept)."""
    per_token = model.config.kv_bytes_per_token
    cases = [(dict(kv="paged", prefix_cache=True, block_size=2, max_num_seqs=5, kv_cache_bytes=60 * 2 * per_token),
              SamplingParams(temperature=0.9, seed=3, n=2, max_new_tokens=20, logprobs=2, prompt_logprobs=1)),
             (dict(kv="paged", kv_cache_dtype="int8", max_model_len=48, block_size=4),
              SamplingParams(temperature=0, max_new_tokens=30, logprobs=0)),
             (dict(kv="paged", prefix_cache=True,
                   speculative=SpeculativeConfig("draft", 3, draft_model=str(checkpoint))),
              SamplingParams(temperature=0, max_new_tokens=12))]
    for config, params in cases:
        single = tp_llm(model, **config)
        expected = outputs(single, params)
        llm = tp_llm(model, tensor_parallel_size=2, **config)
        try:
            assert_same(outputs(llm, params), expected)
            assert llm.engine.pool.is_idle
            if llm.engine.proposer is not None:
                assert llm.engine.speculative_metrics["acceptance_rate"] > 0.9
        finally:
            llm.engine.close()


def test_int8_under_tp_is_each_ranks_shard_quantized_on_its_own(model):
    """Documented (EngineConfig.tensor_parallel_size): a row-parallel layer's int8 scales cover one rank's columns.
    Rank 0's scales are those of its columns alone, and TP=2's prompt logprobs are those of the float model whose
    o_proj / down_proj were quantized a rank's columns at a time, within the noise of the CPU kernels' bfloat16
    activations (TP=1's int8 logprobs are as far from their own reference): a sound int8 model, not TP=1's."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for layer in reference.layers:
            for linear, pieces in ((layer.self_attn.qkv_proj, 1), (layer.mlp.gate_up_proj, 1),
                                   (layer.self_attn.o_proj, 2), (layer.mlp.down_proj, 2)):
                for piece in linear.weight.chunk(pieces, dim=1):  # views: each rank's columns in place
                    codes = quantize_int8(piece)
                    piece.copy_(codes.q.float() * codes.scale[:, None])
    prompt = PROMPTS[3] + [59, 234, 178, 13, 102, 141]
    params = SamplingParams(temperature=0, max_new_tokens=1, prompt_logprobs=0)
    llm = tp_llm(model, tensor_parallel_size=2, kv="paged", quantization="int8")
    try:
        o_proj, whole = llm.engine.model.layers[0].self_attn.o_proj, model.layers[0].self_attn.o_proj.weight
        assert torch.equal(o_proj.scale, quantize_int8(whole[:, : whole.shape[1] // 2]).scale)  # rank 0's columns
        assert not torch.equal(o_proj.scale, quantize_int8(whole).scale)
        tp2 = torch.tensor(outputs(llm, params, [prompt])[0][4][1:])
    finally:
        llm.engine.close()
    want = torch.tensor(outputs(tp_llm(reference, kv="paged"), params, [prompt])[0][4][1:])
    assert (tp2 - want).abs().max() < 0.06
