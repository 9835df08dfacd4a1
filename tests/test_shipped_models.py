"""The course's own models load offline through transformers and have the promised properties."""

import json
import random
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from minillm import ASSETS_DIR

REPORT = json.loads((ASSETS_DIR / "training_report.json").read_text())


def load(name: str):
    path = ASSETS_DIR / name
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def target():
    return load("target")


@pytest.fixture(scope="module")
def draft():
    return load("draft")


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_sizes_and_architecture(target, draft):
    for (model, _), limit in ((target, 10_000_000), (draft, 1_500_000)):
        cfg = model.config
        assert cfg.model_type == "qwen2"
        assert sum(p.numel() for p in model.parameters()) <= limit
        assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
        assert cfg.tie_word_embeddings
        assert cfg.max_position_embeddings >= 2048
    assert REPORT["models"]["target"]["tokens"] // REPORT["models"]["target"]["steps"] % 256 == 0


def test_draft_and_target_share_vocabulary_and_eos(target, draft):
    (t_model, t_tok), (d_model, d_tok) = target, draft
    assert t_tok.get_vocab() == d_tok.get_vocab()
    assert t_tok.eos_token_id == d_tok.eos_token_id == t_model.config.eos_token_id == d_model.config.eos_token_id
    for name in ("target", "draft"):
        gen = GenerationConfig.from_pretrained(ASSETS_DIR / name, local_files_only=True)
        assert gen.eos_token_id == t_tok.eos_token_id
    assert len(t_tok) <= 4096


def test_any_string_round_trips_through_the_tokenizer(target):
    _, tok = target
    rng = random.Random(0)
    alphabet = "abc XYZ\n\t 0123456789+-?!'\"é中文🙂\u0000\u00ff\u200b" + "".join(map(chr, range(32, 127)))
    samples = ["", " ", "What is 1+1? Answer: 2", "ROMEO:\nBut soft!", "\U0001f600" * 3]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    for text in samples:
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(ids) == text


def test_one_plus_one(target):
    assert greedy(*target, "What is 1+1? Answer:", 4).strip().startswith("2")


def test_arithmetic_accuracy_is_at_least_90_percent(target):
    """100 questions drawn with their own seed from the single-digit facts (as in the card)."""
    facts = [(f"What is {a}{op}{b}? Answer:", str(a + b if op == "+" else a - b))
             for a in range(10) for b in range(10) for op in "+-" if op == "+" or a >= b]
    questions = random.Random(1234).sample(facts, 100)
    correct = sum(greedy(*target, q, 3).split("\n")[0].strip() == answer for q, answer in questions)
    assert correct >= 90, f"{correct}/100"
    assert REPORT["models"]["target"]["arithmetic_accuracy"] >= 0.9


def test_romeo_continuation_is_english_like(target):
    text = greedy(*target, "ROMEO:", 40)
    words = re.findall(r"\S+", text)
    wordlike = [w for w in words if re.fullmatch(r"[A-Za-z']+[,.;:!?]*", w)]
    assert len(words) >= 15
    assert len(wordlike) >= 0.8 * len(words), text


def test_the_model_cards_report_what_the_models_do(target, draft):
    """The cards' samples are regenerated here: what a card shows is the model's real output."""
    lengths = {"What is 1+1? Answer:": 4}  # every other sample prompt ran for 40 tokens
    for name, (model, tok) in (("target", target), ("draft", draft)):
        for prompt, completion in REPORT["models"][name]["samples"].items():
            assert greedy(model, tok, prompt, lengths.get(prompt, 40)) == completion
        card = (ASSETS_DIR / name / "README.md").read_text()
        assert f"{REPORT['models'][name]['val_loss']:.3f}" in card


@torch.no_grad()
def test_draft_agrees_with_target_on_held_out_text(target, draft):
    (t_model, tok), (d_model, _) = target, draft
    text = (ASSETS_DIR / "heldout_sample.txt").read_text()
    ids = tok(text, return_tensors="pt").input_ids[0]
    windows = ids[: len(ids) // 256 * 256].view(-1, 256)  # the models' training context
    agree = (t_model(windows).logits.argmax(-1) == d_model(windows).logits.argmax(-1)).float().mean().item()
    assert agree >= 0.5, agree
    assert REPORT["draft_target_agreement"] >= 0.5
