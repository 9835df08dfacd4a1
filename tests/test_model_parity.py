"""minillm's decoder reproduces Hugging Face transformers' logits for every supported family."""

import json

import pytest
import torch

from minillm.attention import ContiguousKVCache, DenseAttention
from minillm.model import load_model
from minillm.model.config import ModelConfig
from tests.hf_reference import FAMILIES, make_checkpoint

PROMPTS = [[5, 17, 99, 3, 250, 41, 7], [88, 12], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [200]]


def hf_logits(hf, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0]  # (len, vocab)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_hf_on_a_flat_batch(family, tmp_path):
    hf = make_checkpoint(family, tmp_path)
    ours = load_model(tmp_path, device="cpu")
    ids = torch.tensor([t for p in PROMPTS for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in PROMPTS])
    with torch.no_grad():
        logits = ours.logits(ours(ids, positions, DenseAttention([len(p) for p in PROMPTS])))
    for got, prompt in zip(logits.split([len(p) for p in PROMPTS]), PROMPTS):
        torch.testing.assert_close(got, hf_logits(hf, prompt), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama3-rope-bias", "qwen2", "qwen3-yarn"])
def test_old_rope_keys_and_sharded_checkpoints_load_the_same(family, tmp_path):
    hf = make_checkpoint(family, tmp_path, old_rope_keys=True, shard=True)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert "rope_scaling" in json.loads((tmp_path / "config.json").read_text())
    ours = load_model(tmp_path, device="cpu")
    prompt = PROMPTS[0]
    with torch.no_grad():
        logits = ours.logits(ours(torch.tensor(prompt), torch.arange(len(prompt)), DenseAttention([len(prompt)])))
    torch.testing.assert_close(logits, hf_logits(hf, prompt), atol=1e-4, rtol=0)


def test_contiguous_cache_prefill_then_decode_matches_full_recompute(tmp_path):
    hf = make_checkpoint("qwen3", tmp_path)
    ours = load_model(tmp_path, device="cpu")
    cfg = ours.config
    cache = ContiguousKVCache(cfg.num_layers, 3, 32, cfg.num_kv_heads, cfg.head_dim)
    prompt = PROMPTS[2]
    with torch.no_grad():
        # slot 1: prefill 10 tokens in two chunks (6 + 4), then decode the rest one by one
        chunks = [prompt[:6], prompt[6:10]] + [[t] for t in prompt[10:]]
        start, rows = 0, []
        for chunk in chunks:
            backend = cache.batch([1], [start], [len(chunk)])
            h = ours(torch.tensor(chunk), torch.arange(start, start + len(chunk)), backend)
            rows.append(ours.logits(h))
            start += len(chunk)
    torch.testing.assert_close(torch.cat(rows), hf_logits(hf, prompt), atol=1e-4, rtol=0)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(family="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                    num_heads=3, num_kv_heads=2, head_dim=4, max_position_embeddings=8)
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="rope_type"):
        ModelConfig(family="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                    num_heads=2, num_kv_heads=2, head_dim=4, max_position_embeddings=8,
                    rope_scaling={"rope_type": "dynamic", "factor": 2.0})


def test_dtype_selection_and_validation(tmp_path):
    hf = make_checkpoint("qwen2", tmp_path)
    ours = load_model(tmp_path, dtype="bfloat16", device="cpu")
    assert ours.dtype == torch.bfloat16 and ours.rope.cos.dtype == torch.bfloat16
    prompt = PROMPTS[0]
    with torch.no_grad():
        logits = ours.logits(ours(torch.tensor(prompt), torch.arange(len(prompt)), DenseAttention([len(prompt)])))
    assert (logits - hf_logits(hf, prompt)).abs().max() < 0.5  # bf16 keeps the function, not every digit
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(tmp_path, dtype="int3", device="cpu")


def test_missing_folder_and_missing_weights_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_model(tmp_path / "nowhere")
    make_checkpoint("llama", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path, device="cpu")
