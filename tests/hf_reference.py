"""Random-initialised tiny Hugging Face models of each supported family, saved as checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              initializer_range=0.2)  # large enough that greedy outputs vary instead of repeating

# name -> (config class, extra config fields)
FAMILIES = {
    "llama": (LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3-rope-bias": (LlamaConfig, dict(
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2": (Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen2-linear-rope": (Qwen2Config, dict(
        tie_word_embeddings=False, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "qwen3": (Qwen3Config, dict(tie_word_embeddings=True, head_dim=32)),
    "qwen3-yarn": (Qwen3Config, dict(
        tie_word_embeddings=False, head_dim=24,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128})),
}


def make_checkpoint(name: str, folder: Path, seed: int = 0, old_rope_keys: bool = False,
                    shard: bool = False, **overrides):
    """Build, randomly initialise, and save an HF model; returns it (fp32, eval mode). `overrides`
    change config fields (e.g. vocab_size=8 for the statistical tests of sampling)."""
    config_cls, extra = FAMILIES[name]
    config = config_cls(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # HF's init leaves norms at 1 and biases at 0: randomise them too
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    model.save_pretrained(folder, max_shard_size="100KB" if shard else "5GB")
    if old_rope_keys:
        _rewrite_rope_keys_old_style(folder / "config.json")
    return model


def _rewrite_rope_keys_old_style(path: Path) -> None:
    """`rope_parameters` -> the older `rope_theta` + `rope_scaling` keys, as older checkpoints have."""
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    path.write_text(json.dumps(cfg))


class ByteTokenizer:
    """A stand-in tokenizer for the random models: token id i is the byte i (vocab 256)."""

    eos_token_id = COMMON["eos_token_id"]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids):
        """A token's name: printable ASCII is itself, any other byte <0xNN> (as SentencePiece names a raw byte)."""
        name = lambda i: chr(i) if 32 <= i < 127 else f"<0x{i:02X}>"  # noqa: E731
        return name(ids) if isinstance(ids, int) else [name(i) for i in ids]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face's own greedy generation, never stopping early."""
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             min_new_tokens=0, pad_token_id=0)
    return out[0, len(prompt):].tolist()
