"""The loader refuses an incomplete or corrupt checkpoint, naming the tensor, instead of serving garbage."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minillm import ASSETS_DIR
from minillm.model import load_model
from tests.hf_reference import make_checkpoint

TARGET = ASSETS_DIR / "target"
TARGET_TENSORS = load_file(TARGET / "model.safetensors")


def write_variant(folder: Path, tensors: dict[str, torch.Tensor], source: Path = TARGET) -> Path:
    """A copy of `source`'s config and tokenizer files with `tensors` as its single model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.suffix == ".json" and not file.name.startswith("model.safetensors"):
            shutil.copy(file, folder / file.name)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def refused(folder: Path, *names: str, dtype: str | None = None) -> str:
    """Loading `folder` raises a ValueError that quotes every one of `names` and the folder; returns the message."""
    with pytest.raises(ValueError) as err:
        load_model(folder, dtype=dtype, device="cpu")
    message = str(err.value)
    for name in names:
        assert re.search(rf"\b{re.escape(name)}\b", message), message
    assert str(folder) in message
    return message


def test_the_shipped_target_loads_unchanged():
    model = load_model(TARGET, device="cpu")
    torch.testing.assert_close(model.embed_tokens.weight, TARGET_TENSORS["model.embed_tokens.weight"], atol=0, rtol=0)
    qkv = model.layers[0].self_attn.qkv_proj.weight
    expected = torch.cat([TARGET_TENSORS[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    torch.testing.assert_close(qkv, expected, atol=0, rtol=0)


def test_missing_any_one_tensor_is_refused_by_name(tmp_path):
    """Every tensor of the shipped target, one at a time: fused shards (q/k/v, gate/up) count separately."""
    assert len(TARGET_TENSORS) > 90  # 8 layers x 12 tensors + embeddings + final norm
    folder = tmp_path / "ckpt"
    for name in sorted(TARGET_TENSORS):
        write_variant(folder, {n: t for n, t in TARGET_TENSORS.items() if n != name})
        message = refused(folder, name)
        assert "lacks 1 tensor:" in message and "no place" not in message, message


def test_several_missing_tensors_are_listed_at_once_and_truncated(tmp_path):
    dropped = ["model.layers.3.self_attn.k_proj.weight", "model.layers.5.mlp.up_proj.weight", "model.norm.weight"]
    refused(write_variant(tmp_path / "three", {n: t for n, t in TARGET_TENSORS.items() if n not in dropped}), *dropped)
    only_embed = {"model.embed_tokens.weight": TARGET_TENSORS["model.embed_tokens.weight"]}
    message = refused(write_variant(tmp_path / "empty", only_embed), "model.layers.0.self_attn.q_proj.weight")
    assert f"lacks {len(TARGET_TENSORS) - 1} tensors" in message
    assert re.search(r"\.\.\. and \d+ more", message) and len(message) < 1000, message


@pytest.mark.parametrize("extra", ["model.layers.0.mlp.extra_proj.weight", "model.layers.8.input_layernorm.weight",
                                   "model.layers.0.self_attn.qkv_proj.weight", "score.weight"])
def test_an_unexpected_tensor_is_refused_by_name(extra, tmp_path):
    folder = write_variant(tmp_path, {**TARGET_TENSORS, extra: torch.ones(256)})
    assert "no place for" in refused(folder, extra)


def test_rotary_inv_freq_of_old_llama_checkpoints_is_ignored_as_transformers_does(tmp_path):
    inv_freq = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(32) for i in range(8)}
    load_model(write_variant(tmp_path, {**TARGET_TENSORS, **inv_freq}), device="cpu")


def test_the_same_tensor_in_two_shards_is_refused(tmp_path):
    folder = write_variant(tmp_path, TARGET_TENSORS)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    norm = {"model.norm.weight": TARGET_TENSORS["model.norm.weight"]}
    save_file(norm, folder / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    weight_map = {n: "model-00001-of-00002.safetensors" for n in TARGET_TENSORS}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert "stored twice" in refused(folder, "model.norm.weight")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_values_are_refused_by_name(bad, tmp_path):
    name = "model.layers.2.self_attn.v_proj.weight"
    weight = TARGET_TENSORS[name].clone()
    weight[3, 7] = bad
    assert "NaN or inf" in refused(write_variant(tmp_path, {**TARGET_TENSORS, name: weight}), name)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_a_weight_that_is_not_floating_point_is_refused_by_name(dtype, tmp_path):
    name = "model.layers.1.mlp.gate_proj.weight"
    weight = TARGET_TENSORS[name].to(dtype)
    message = refused(write_variant(tmp_path, {**TARGET_TENSORS, name: weight}), name)
    assert str(dtype) in message and "floating-point" in message


@pytest.mark.parametrize("shape", [(1,), (256, 1), (4096, 128)])
def test_a_wrong_shape_is_refused_even_when_it_would_broadcast(shape, tmp_path):
    name = "model.embed_tokens.weight" if len(shape) == 2 else "model.layers.4.post_attention_layernorm.weight"
    folder = write_variant(tmp_path, {**TARGET_TENSORS, name: torch.ones(shape)})
    assert f"shape {shape}" in refused(folder, name)


def test_float_dtypes_cast_but_values_beyond_the_chosen_dtype_are_refused(tmp_path):
    half = write_variant(tmp_path / "bf16", {n: t.to(torch.bfloat16) for n, t in TARGET_TENSORS.items()})
    model = load_model(half, dtype="float32", device="cpu")
    assert model.dtype == torch.float32
    torch.testing.assert_close(model.norm.weight, TARGET_TENSORS["model.norm.weight"].to(torch.bfloat16).float())
    name = "model.layers.0.mlp.down_proj.weight"
    weight = TARGET_TENSORS[name].clone()
    weight[0, 0] = 1e6  # finite in float32, inf in float16
    big = write_variant(tmp_path / "big", {**TARGET_TENSORS, name: weight})
    load_model(big, dtype="float32", device="cpu")
    assert "overflows torch.float16" in refused(big, name, dtype="float16")


def test_a_tied_checkpoint_may_carry_its_lm_head_only_as_a_copy_of_the_embeddings(tmp_path):
    """transformers ties an equal lm_head.weight, ties it symmetrically when the embeddings are absent, and unties
    a different one (the config is then wrong): minillm accepts the first two and refuses the third."""
    embed = TARGET_TENSORS["model.embed_tokens.weight"]
    load_model(write_variant(tmp_path / "copy", {**TARGET_TENSORS, "lm_head.weight": embed.clone()}), device="cpu")
    rest = {n: t for n, t in TARGET_TENSORS.items() if n != "model.embed_tokens.weight"}
    swapped = load_model(write_variant(tmp_path / "head-only", {**rest, "lm_head.weight": embed}), device="cpu")
    torch.testing.assert_close(swapped.embed_tokens.weight, embed, atol=0, rtol=0)
    other = write_variant(tmp_path / "other", {**TARGET_TENSORS, "lm_head.weight": embed + 1})
    assert "tie_word_embeddings" in refused(other, "lm_head.weight")


@pytest.mark.parametrize("name", ["lm_head.weight", "model.layers.1.self_attn.k_proj.bias",
                                  "model.layers.0.mlp.up_proj.bias", "model.layers.1.self_attn.o_proj.bias"])
def test_an_untied_llama_with_biases_missing_one_tensor_is_refused(name, tmp_path):
    make_checkpoint("llama3-rope-bias", tmp_path / "full", tie_word_embeddings=False)
    tensors = load_file(tmp_path / "full" / "model.safetensors")
    assert name in tensors
    refused(write_variant(tmp_path / "less", {n: t for n, t in tensors.items() if n != name}, tmp_path / "full"), name)


def test_a_sharded_checkpoint_missing_a_tensor_is_refused(tmp_path):
    make_checkpoint("qwen3", tmp_path, shard=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    name = "model.layers.1.self_attn.k_norm.weight"
    shard = tmp_path / index["weight_map"][name]
    save_file({n: t for n, t in load_file(shard).items() if n != name}, shard, metadata={"format": "pt"})
    refused(tmp_path, name)
