"""compile=True for real (chapter 8): torch.compile records the whole decode step without a graph
break, once per bucket used (a growing context does not recompile), and the engine's greedy tokens
stay the naive loop's across bucket edges, preemption and an abort. Compiling costs seconds per
bucket, so these tests are few and their models tiny. Regressions from the hostile probe: weights
changed in place are compiled afresh, and every engine of a process compiles its own steps."""

import logging

import torch
from torch._dynamo.utils import counters

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.model import load_model
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer, make_checkpoint
from tests.test_engine import _reference, paged_budget


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def compiled_engine(model, num_blocks: int) -> LLMEngine:
    config = EngineConfig(max_num_seqs=5, max_model_len=64, kv="paged", block_size=8, compile=True,
                          kv_cache_bytes=paged_budget(model, 8, num_blocks), graph_batch_sizes=(1, 4))
    return LLMEngine(model, ByteTokenizer(), config)


def test_compiled_steps_give_the_naive_loops_tokens_across_buckets_and_preemption(model):
    torch._dynamo.reset()
    counters.clear()
    engine = compiled_engine(model, num_blocks=9)  # 72 tokens of KV for 5 requests growing to ~45: preemptions
    prompts = [[5 + i, 6, 7, 8 + i] for i in range(5)]
    lengths = [40, 34, 28, 12, 6]
    ids = [engine.add_request(p, greedy(n)).request_id for p, n in zip(prompts, lengths)]
    doomed = engine.add_request([9, 9, 9], greedy(30)).request_id
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == 8:
            engine.abort(doomed)
    recorded = engine.runner.recorded
    assert recorded.disabled_reason is None
    for request_id, prompt, n in zip(ids, prompts, lengths):
        assert engine.output(request_id).token_ids == _reference(model, tuple(prompt), n)
    assert any(step.preempted for step in engine.trace.steps)
    batches = {step.recorded_batch for step in engine.trace.steps}
    assert {1, 4} <= batches and None in batches  # 2-4 decodes pad to 4; prefills and 5 decodes run eagerly
    assert recorded.compiled_buckets == {1, 4}
    assert not counters["graph_break"], dict(counters["graph_break"])  # fullgraph=True: a break would raise
    # one graph per bucket: contexts grew from 4 to 44 tokens (1 to 6 blocks) without recompiling
    assert counters["stats"]["unique_graphs"] == 2


def test_a_step_that_cannot_compile_runs_eagerly_with_a_message(model, caplog):
    engine = compiled_engine(model, num_blocks=20)
    recorded = engine.runner.recorded

    def broken(*args):
        raise RuntimeError("no C compiler found\nmore detail")

    recorded._compiled = broken
    with caplog.at_level(logging.WARNING, logger="minillm"):
        ids = [engine.add_request([5, 6, i], greedy(6)).request_id for i in (7, 8)]
        while engine.has_unfinished():
            engine.step()
    assert recorded.disabled_reason == "RuntimeError: no C compiler found"
    assert "could not be compiled (RuntimeError: no C compiler found)" in caplog.text
    for request_id, i in zip(ids, (7, 8)):
        assert engine.output(request_id).token_ids == _reference(model, (5, 6, i), 6)
    assert not any(step.recorded_batch for step in engine.trace.steps)


def test_weights_changed_in_place_are_compiled_afresh(model, tmp_path):
    """The compiled step holds the weights frozen, as constants: after load_state_dict it must not
    keep decoding with the old ones (the prefill, eager, would already use the new)."""
    make_checkpoint("qwen3", tmp_path, seed=4)
    other = load_model(tmp_path, device="cpu")
    mine = load_model(tmp_path, device="cpu")
    with torch.no_grad():
        mine.load_state_dict(model.state_dict())
    config = EngineConfig(max_num_seqs=2, max_model_len=64, kv="paged", block_size=8, compile=True,
                          kv_cache_bytes=paged_budget(mine, 8, 12), graph_batch_sizes=(1,))
    engine = LLMEngine(mine, ByteTokenizer(), config)

    def decode() -> list[int]:
        request_id = engine.add_request([5, 6, 7], greedy(8)).request_id
        while engine.has_unfinished():
            engine.step()
        return engine.output(request_id).token_ids

    assert decode() == _reference(model, (5, 6, 7), 8)
    with torch.no_grad():
        mine.load_state_dict(other.state_dict())
    assert decode() == _reference(other, (5, 6, 7), 8) != _reference(model, (5, 6, 7), 8)
    assert engine.runner.recorded.compiled_buckets == {1}


def test_a_model_loaded_under_inference_mode_compiles(tmp_path):
    make_checkpoint("qwen3", tmp_path, seed=3)
    with torch.inference_mode():  # its weights are inference tensors, which keep no version counter
        model = load_model(tmp_path, device="cpu")
        engine = compiled_engine(model, num_blocks=12)
        request_id = engine.add_request([5, 6, 7], greedy(5)).request_id
        while engine.has_unfinished():
            engine.step()
    assert engine.runner.recorded.compiled_buckets == {1}
    assert engine.output(request_id).token_ids == _reference(model, (5, 6, 7), 5)


def test_every_engine_in_a_process_compiles_its_own_steps(model):
    """torch keeps a function's compiled graphs, and its limit on how many, per code object: engines
    sharing one would stop compiling after a few (9 graphs here), silently or with an error."""
    for i in range(10):
        config = EngineConfig(max_num_seqs=2, max_model_len=64, kv="paged", block_size=8, compile=True,
                              kv_cache_bytes=paged_budget(model, 8, 12 + i), graph_batch_sizes=(1,))
        engine = LLMEngine(model, ByteTokenizer(), config)
        request_id = engine.add_request([5, 6, 7 + i], greedy(4)).request_id
        while engine.has_unfinished():
            engine.step()
        assert engine.runner.recorded.disabled_reason is None, f"engine {i}: {engine.runner.recorded.disabled_reason}"
        assert engine.runner.recorded.compiled_buckets == {1}
        assert engine.output(request_id).token_ids == _reference(model, (5, 6, 7 + i), 4)
