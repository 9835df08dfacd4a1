"""On an NVIDIA GPU: the engine with the Triton paged kernels reproduces the naive loop (skipped without CUDA;
scripts/gpu_check.sh runs it)."""

import pytest
import torch

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.generate import generate_without_cache
from minillm.model import load_model
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer, make_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_triton_paged_engine_on_cuda_matches_the_naive_loop(tmp_path, block_size):
    pytest.importorskip("triton")
    make_checkpoint("qwen3", tmp_path, seed=3)
    model = load_model(tmp_path, device="cuda", dtype=torch.float32)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14] * 9, [20, 21]]
    greedy = SamplingParams(temperature=0, max_new_tokens=30, ignore_eos=True)
    expected = [generate_without_cache(model, ByteTokenizer(), p, greedy).token_ids for p in prompts]
    for blocks in (64, 12):  # roomy, then small enough to preempt
        config = EngineConfig(max_num_seqs=4, max_model_len=64, kv="paged", block_size=block_size,
                              kv_cache_bytes=blocks * block_size * 2 * model.config.num_layers
                              * model.config.num_kv_heads * model.config.head_dim * 4, use_triton=True,
                              device="cuda", dtype="float32")
        engine = LLMEngine(model, ByteTokenizer(), config)
        assert engine.cache.ops.__name__.endswith("triton_paged")
        ids = [engine.add_request(p, greedy).request_id for p in prompts]
        while engine.has_unfinished():
            engine.step()
        assert [engine.output(i).token_ids for i in ids] == expected


@pytest.mark.parametrize("block_size", [8, 16])
def test_prefix_cache_with_triton_on_cuda_matches_the_naive_loop(tmp_path, block_size):
    """Shared prefixes, a fully cached prompt, and a pool small enough to evict and preempt."""
    pytest.importorskip("triton")
    make_checkpoint("qwen3", tmp_path, seed=3)
    model = load_model(tmp_path, device="cuda", dtype=torch.float32)
    shared = list(range(40, 72))
    prompts = [shared + [5], shared + [6, 7], shared[:16], shared[:24], shared + [5], list(range(100, 120))]
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    expected = [generate_without_cache(model, ByteTokenizer(), p, greedy).token_ids for p in prompts]
    per_token = 2 * model.config.num_layers * model.config.num_kv_heads * model.config.head_dim * 4
    for blocks in (64, 10):
        config = EngineConfig(max_num_seqs=3, max_model_len=64, kv="paged", block_size=block_size,
                              kv_cache_bytes=blocks * block_size * per_token, use_triton=True, prefix_cache=True,
                              device="cuda", dtype="float32")
        engine = LLMEngine(model, ByteTokenizer(), config)
        outputs = []
        for prompt in prompts:  # one at a time, so that each finds its predecessors' blocks
            request_id = engine.add_request(prompt, greedy).request_id
            while engine.has_unfinished():
                engine.step()
            outputs.append(engine.output(request_id))
        assert [o.token_ids for o in outputs] == expected
        assert outputs[3].num_cached_tokens > 0 and outputs[4].num_cached_tokens > 0


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_chunked_prefill_with_triton_on_cuda_matches_the_naive_loop(tmp_path, chunk):
    """Chunks through the Triton extend kernel: mid-block starts, a prompt longer than the step budget,
    the prefix cache, and a pool small enough to preempt."""
    pytest.importorskip("triton")
    make_checkpoint("qwen3", tmp_path, seed=3)
    model = load_model(tmp_path, device="cuda", dtype=torch.float32)
    shared = list(range(40, 90))
    prompts = [shared + [5], [8, 9], shared[:30] + [6, 7], list(range(100, 160)), shared + [5]]
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    expected = [generate_without_cache(model, ByteTokenizer(), p, greedy).token_ids for p in prompts]
    per_token = 2 * model.config.num_layers * model.config.num_kv_heads * model.config.head_dim * 4
    for blocks, prefix_cache in ((64, False), (64, True), (14, True)):
        config = EngineConfig(max_num_seqs=3, max_model_len=96, kv="paged", block_size=16, use_triton=True,
                              kv_cache_bytes=blocks * 16 * per_token, prefix_cache=prefix_cache, chunked_prefill=True,
                              max_tokens_per_prefill_chunk=chunk, max_tokens_per_step=40, device="cuda",
                              dtype="float32")
        engine = LLMEngine(model, ByteTokenizer(), config)
        ids = []
        for k, prompt in enumerate(prompts):
            ids.append(engine.add_request(prompt, greedy).request_id)
            for _ in range(k):  # staggered arrivals: chunks share steps with decodes
                if engine.has_unfinished():
                    engine.step()
        while engine.has_unfinished():
            engine.step()
        assert [engine.output(i).token_ids for i in ids] == expected


@pytest.mark.parametrize("method, k", [("draft", 1), ("draft", 4), ("ngram", 3), ("draft", 6)])
def test_speculative_decoding_on_cuda_matches_the_naive_loop(method, k):
    """The shipped target and draft on CUDA (float32), paged through the Triton kernels, with a pool small
    enough to preempt: speculation changes no greedy token."""
    pytest.importorskip("triton")
    from minillm.config import SpeculativeConfig
    from minillm.model.loader import load_tokenizer

    model, tokenizer = load_model(device="cuda", dtype=torch.float32), load_tokenizer()
    text = tokenizer.encode("to be or not to be, that is the question: whether 'tis nobler in the mind to suffer")
    prompts = [text, text[:12], text[5:30] + text[5:15], text[3:9]]
    greedy = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    expected = [generate_without_cache(model, tokenizer, p, greedy).token_ids for p in prompts]
    per_token = 2 * model.config.num_layers * model.config.num_kv_heads * model.config.head_dim * 4
    for blocks in (64, 14):
        config = EngineConfig(max_num_seqs=3, max_model_len=128, kv="paged", block_size=16, use_triton=True,
                              kv_cache_bytes=blocks * 16 * per_token, device="cuda", dtype="float32",
                              speculative=SpeculativeConfig(method=method, num_speculative_tokens=k))
        engine = LLMEngine(model, tokenizer, config)
        ids = [engine.add_request(p, greedy).request_id for p in prompts]
        while engine.has_unfinished():
            engine.step()
        assert [engine.output(i).token_ids for i in ids] == expected
        assert engine.speculative_metrics["passes"] > 0
        assert not engine.pool.tables and engine.pool.num_free_blocks == engine.pool.num_blocks  # no block leaks


@pytest.mark.parametrize("use_triton", [True, False])
def test_cuda_graphs_match_the_naive_loop_across_buckets_preemption_and_aborts(tmp_path, use_triton):
    """Chapter 8: one graph per bucket (1, 2, 4), 1-6 decodes (5 and 6 run eagerly), a pool small
    enough to preempt, an abort mid-run; the torch attention and the Triton kernels."""
    if use_triton:
        pytest.importorskip("triton")
    make_checkpoint("qwen3", tmp_path, seed=3)
    model = load_model(tmp_path, device="cuda", dtype=torch.float32)
    prompts = [[5 + i, 6, 7 + i] for i in range(6)]
    lengths = [30, 26, 22, 14, 8, 4]
    expected = [generate_without_cache(model, ByteTokenizer(), p, SamplingParams(temperature=0, max_new_tokens=n,
                                                                                 ignore_eos=True)).token_ids
                for p, n in zip(prompts, lengths)]
    per_token = 2 * model.config.num_layers * model.config.num_kv_heads * model.config.head_dim * 4
    for blocks in (96, 14):
        config = EngineConfig(max_num_seqs=6, max_model_len=64, kv="paged", block_size=8, device="cuda",
                              dtype="float32", kv_cache_bytes=blocks * 8 * per_token, use_triton=use_triton,
                              cuda_graphs=True, graph_batch_sizes=(1, 2, 4))
        engine = LLMEngine(model, ByteTokenizer(), config)
        assert set(engine.runner.recorded.graphs) == {1, 2, 4}  # captured at start-up
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)).request_id
               for p, n in zip(prompts, lengths)]
        doomed = engine.add_request([9, 9], SamplingParams(temperature=0, max_new_tokens=40)).request_id
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == 5:
                engine.abort(doomed)
        assert [engine.output(i).token_ids for i in ids] == expected
        assert {1, 2, 4} <= {step.recorded_batch for step in engine.trace.steps}
        if blocks == 14:
            assert any(step.preempted for step in engine.trace.steps)


def test_a_graph_replay_allocates_nothing(tmp_path):
    pytest.importorskip("triton")
    make_checkpoint("qwen3", tmp_path, seed=3)
    model = load_model(tmp_path, device="cuda", dtype=torch.float32)
    config = EngineConfig(max_num_seqs=4, max_model_len=64, kv="paged", block_size=8, device="cuda", dtype="float32",
                          kv_cache_bytes=32 * 8 * 2 * model.config.num_layers * model.config.num_kv_heads
                          * model.config.head_dim * 4, cuda_graphs=True, graph_batch_sizes=(4,))
    engine = LLMEngine(model, ByteTokenizer(), config)
    for p in ([5, 6], [7, 8, 9]):
        engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True))
    engine.step()  # the prefills, eagerly
    graph, logits = engine.runner.recorded.graphs[4]
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (allocated, reserved)
    while engine.has_unfinished():
        engine.step()
    assert all(step.recorded_batch == 4 for step in engine.trace.steps[1:])
