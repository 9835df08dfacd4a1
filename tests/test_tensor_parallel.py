"""Tensor parallelism (chapter 13): the sharding arithmetic, the engine at TP=2 and TP=4 in worker
processes giving the naive loop's greedy tokens, and what happens when a rank is lost.

Every engine test ends with no worker process left behind (`no_orphans`), on top of conftest's
checks that no request, slot or KV block is left."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.distributed.executor import TensorParallelWorkers
from minillm.distributed.sharding import TensorShard, check_shardable
from minillm.engine import LLM, EngineStopped, LLMEngine
from minillm.engine_core import ProcessAsyncLLM
from minillm.generate import generate_with_cache
from minillm.model import load_model
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer, make_checkpoint

# name -> (the test checkpoint, its overrides): heads that split evenly, and KV heads replicated
FAMILIES = {
    "llama": ("llama", dict(num_key_value_heads=4)),  # 4 q / 4 KV heads: both split at TP=2 and 4; untied head
    "llama-biases": ("llama3-rope-bias", {}),  # 4 / 2; o_proj and down_proj biases are added by rank 0 only
    "qwen2": ("qwen2", dict(vocab_size=250)),  # 4 / 2: replicated at TP=4; qkv bias; the vocabulary is padded
    "qwen3": ("qwen3", dict(num_key_value_heads=1)),  # 4 / 1: replicated at TP=2 and 4; q/k norms
}
GREEDY = SamplingParams(temperature=0, max_new_tokens=10)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(autouse=True)
def no_orphans():
    """No process this test started outlives it (a stopped engine's workers are gone within seconds)."""
    before = _children()
    yield
    gc.collect()
    deadline = time.monotonic() + 10
    while (left := _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folders = {}
    for name, (family, overrides) in FAMILIES.items():
        folder = tmp_path_factory.mktemp(name)
        make_checkpoint(family, folder, seed=7, **overrides)
        folders[name] = folder
    return folders


def prompts() -> list[list[int]]:
    """A mixed workload: two prompts sharing 20 tokens (a prefix-cache hit), a long one (chunked), short ones."""
    shared = list(range(30, 50))
    return [shared + [3, 4, 5], shared + [7, 8], list(range(60, 130)), [11, 12, 13], [200, 9]]


def naive(model, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return generate_with_cache(model, ByteTokenizer(), prompt, params).token_ids


def tp_llm(folder, **config) -> LLM:
    """`LLM` over a test checkpoint (which has no tokenizer files: the byte tokenizer stands in)."""
    llm = object.__new__(LLM)
    llm.engine = LLMEngine(load_model(folder), ByteTokenizer(), EngineConfig(**config))
    return llm


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    """The first prompt runs a few steps alone (its blocks are cached by then); the rest join it."""
    engine.add_request(prompts[0], params, request_id="0")
    for _ in range(3):
        engine.step()
    for i, prompt in enumerate(prompts[1:], start=1):
        engine.add_request(prompt, params, request_id=str(i))
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.output(str(i)).token_ids for i in range(len(prompts))]
    for i in range(len(prompts)):
        engine.release(str(i))
    return outputs


# ---------------------------------------------------------------------------- the arithmetic, in one process
@pytest.mark.parametrize("size", [2, 4])
def test_column_shards_side_by_side_and_row_shards_summed_give_the_whole_layer(size):
    torch.manual_seed(0)
    x, column, row = torch.randn(5, 16), torch.randn(24, 16), torch.randn(16, 24)
    out_rows = 24 // size
    columns = [x @ column[r * out_rows : (r + 1) * out_rows].T for r in range(size)]  # no exchange needed
    torch.testing.assert_close(torch.cat(columns, dim=-1), x @ column.T)
    h = x @ column.T
    partials = [h[:, r * out_rows : (r + 1) * out_rows] @ row[:, r * out_rows : (r + 1) * out_rows].T
                for r in range(size)]
    torch.testing.assert_close(sum(partials), h @ row.T)  # the all-reduce


def test_shards_hold_their_heads_rows_and_vocabulary(checkpoints):
    config = load_model(checkpoints["qwen2"]).config  # 4 heads, 2 KV heads, 96 MLP rows, 250 tokens
    shards = [TensorShard(r, 4) for r in range(4)]
    assert [list(s.q_heads(config)) for s in shards] == [[0], [1], [2], [3]]
    assert [list(s.kv_heads(config)) for s in shards] == [[0], [0], [1], [1]]  # replicated: q heads 0, 1 read KV 0
    assert [s.vocab_rows(config) for s in shards][-1] == range(189, 252)  # 63 rows each, 2 of them padding
    whole = torch.arange(250 * 3).reshape(250, 3)
    assert torch.equal(shards[-1].shard("embed_tokens.weight", whole, config)[-2:], torch.zeros(2, 3,
                                                                                                 dtype=whole.dtype))
    local = shards[1].local_config(config)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (1, 1, 24, 63)
    assert not shards[1].holds("layers.0.mlp.down_proj.bias") and shards[0].holds("layers.0.mlp.down_proj.bias")


def test_sizes_that_do_not_divide_the_model_are_refused_by_name(checkpoints):
    config = load_model(checkpoints["qwen2"]).config
    with pytest.raises(ValueError, match="attention heads"):
        check_shardable(config, 3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer in"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="compile=True is not supported"):
        EngineConfig(tensor_parallel_size=2, kv="paged", compile=True)


# ---------------------------------------------------------------------------- the engine across processes
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_tp_gives_the_naive_loops_greedy_tokens(checkpoints, family, size):
    """Paged cache, prefix cache and chunked prefill, at TP=2 and 4: every token equals TP=1's naive loop."""
    model = load_model(checkpoints[family])
    expected = [naive(model, p) for p in prompts()]
    config = EngineConfig(tensor_parallel_size=size, kv="paged", block_size=8, prefix_cache=True,
                          chunked_prefill=True, max_tokens_per_prefill_chunk=16, max_num_seqs=4)
    engine = LLMEngine(model, None, config, detokenize=False)
    try:
        assert len(engine.workers.processes) == size - 1
        assert engine.model.shard_config.num_heads == 4 // size
        assert run(engine, prompts()) == expected
        assert engine.prefix_cache_hit_rate > 0
    finally:
        engine.close()


def test_tp_with_a_contiguous_cache_static_batches_speculation_and_preemption(checkpoints):
    model = load_model(checkpoints["qwen3"])
    expected = [naive(model, p) for p in prompts()]
    for config in (EngineConfig(tensor_parallel_size=2, batching="static", max_num_seqs=3),
                   EngineConfig(tensor_parallel_size=2, kv="paged", speculative=SpeculativeConfig("ngram", 3)),
                   EngineConfig(tensor_parallel_size=2, kv="paged", block_size=4, max_num_seqs=4,
                                kv_cache_bytes=24 * 4 * model.config.kv_bytes_per_token)):  # 24 blocks (1 KV head each)
        engine = LLMEngine(model, None, config, detokenize=False)
        try:
            assert run(engine, prompts()) == expected, config
            if config.kv_cache_bytes is not None:
                assert engine.num_preemptions > 0
        finally:
            engine.close()


@pytest.mark.parametrize("size", [2, 4])
def test_tp_serves_the_shipped_target_with_its_tokenizer(size):
    llm = LLM(config=EngineConfig(tensor_parallel_size=size, kv="paged", prefix_cache=True))
    try:
        texts = ["ROMEO:", "What is 12+7? Answer:"]
        params = SamplingParams(temperature=0, max_new_tokens=12)
        single = LLM(config=EngineConfig(kv="paged"))
        assert [o.text for o in llm.generate(texts, params, use_tqdm=False)] == \
            [o.text for o in single.generate(texts, params, use_tqdm=False)]
    finally:
        llm.engine.close()


def test_an_abort_mid_flight_frees_every_block_on_every_rank(checkpoints):
    model = load_model(checkpoints["qwen2"])
    engine = LLMEngine(model, None, EngineConfig(tensor_parallel_size=2, kv="paged", block_size=4),
                       detokenize=False)
    try:
        engine.add_request(list(range(20, 60)), SamplingParams(temperature=0, max_new_tokens=50), request_id="a")
        engine.add_request([5, 6, 7], GREEDY, request_id="b")
        engine.step()
        engine.step()
        assert engine.abort("a")
        while engine.has_unfinished():
            engine.step()
        assert engine.output("b").token_ids == naive(model, [5, 6, 7])  # the neighbour never noticed
        assert engine.pool.is_idle
    finally:
        engine.close()


# ---------------------------------------------------------------------------- faults
def test_a_worker_killed_mid_step_stops_the_engine_with_its_reason(checkpoints):
    llm = tp_llm(checkpoints["llama"], tensor_parallel_size=2, kv="paged")
    workers = llm.engine.workers
    victim = workers.processes[0]
    send = workers.run_step

    def send_then_kill(*args):
        send(*args)  # the worker has the step: it dies inside it, rank 0 meets it in the first all-reduce
        victim.send_signal(signal.SIGKILL)

    workers.run_step = send_then_kill
    began = time.monotonic()
    with pytest.raises(EngineStopped, match=r"worker 1 .*killed by SIGKILL"):
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert time.monotonic() - began < 10
    with pytest.raises(EngineStopped, match="the engine has stopped"):
        llm.engine.add_request([1, 2, 3], GREEDY)
    assert not workers.alive()


def test_a_worker_killed_between_steps_stops_the_next_one(checkpoints):
    llm = tp_llm(checkpoints["llama"], tensor_parallel_size=4, kv="paged")
    llm.engine.workers.processes[1].kill()
    llm.engine.workers.processes[1].wait()
    with pytest.raises(EngineStopped, match="worker 2"):
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert not llm.engine.workers.alive()  # the other workers are stopped too


def test_async_requests_in_flight_end_with_the_error_and_new_ones_are_refused(checkpoints):
    engine = LLMEngine(load_model(checkpoints["qwen3"]), None, EngineConfig(tensor_parallel_size=2, kv="paged"),
                       detokenize=False)
    llm = AsyncLLM(engine=engine)

    async def scenario():
        futures = [llm.submit([1, 2, 3, 4], SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True))
                   for _ in range(3)]
        while not engine.scheduler.running:
            await asyncio.sleep(0.01)
        engine.workers.processes[0].kill()
        outputs = await asyncio.wait_for(asyncio.gather(*futures), timeout=20)
        assert {o.finish_reason for o in outputs} == {"error"}
        assert all("worker 1" in o.error for o in outputs)
        assert llm.error is not None and "worker 1" in llm.error
        with pytest.raises(EngineStopped):
            await llm.submit([1, 2], GREEDY)

    asyncio.run(scenario())


def test_a_worker_of_an_engine_core_process_lost_ends_the_servers_requests_with_its_reason():
    """`serve --tensor-parallel-size 2`'s default shape: the engine core in its own process is rank 0."""
    llm = ProcessAsyncLLM(config=EngineConfig(tensor_parallel_size=2, kv="paged"), threads=1)
    try:
        async def go():
            future = llm.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=500, ignore_eos=True))
            await asyncio.sleep(1.0)
            (worker,) = psutil.Process(llm.core_pid).children()
            worker.kill()
            out = await asyncio.wait_for(future, timeout=20)
            assert out.finish_reason == "error" and "worker 1" in out.error and "SIGKILL" in out.error
            assert "worker 1" in llm.error  # the server's /health answers 503 with it

        asyncio.run(go())
    finally:
        llm.close()


def test_workers_end_when_the_engine_process_is_killed(checkpoints, tmp_path):
    """Rank 0 dies without a word (SIGKILL): its workers notice (a closed pipe) and exit — no orphans."""
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from minillm.config import EngineConfig
        from minillm.engine import LLMEngine
        from minillm.model import load_model
        engine = LLMEngine(load_model({str(checkpoints['qwen2'])!r}), None, EngineConfig(tensor_parallel_size=4),
                           detokenize=False)
        print(" ".join(str(p.pid) for p in engine.workers.processes), flush=True)
        time.sleep(60)
    """))
    rank0 = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(__file__)))
    pids = [int(p) for p in rank0.stdout.readline().split()]
    assert len(pids) == 3
    rank0.kill()
    rank0.wait()
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "a worker outlived its engine"
        time.sleep(0.1)


def test_closed_or_collected_workers_leave_no_process(checkpoints):
    model = load_model(checkpoints["qwen3"])
    threads = torch.get_num_threads()
    engine = LLMEngine(model, None, EngineConfig(tensor_parallel_size=2), detokenize=False)
    pids = [p.pid for p in engine.workers.processes]
    engine.close()
    assert not any(psutil.pid_exists(p) for p in pids)
    assert torch.get_num_threads() == threads  # this process's threads given back
    workers = TensorParallelWorkers(model, 2)  # no engine around them: collected, they stop
    pids = [p.pid for p in workers.processes]
    del workers
    gc.collect()
    assert not any(psutil.pid_exists(p) for p in pids)
