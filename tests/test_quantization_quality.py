"""The quality yardsticks of chapter 12 (minillm/quantization/quality.py), each checked against a computation
made another way: perplexity against transformers' own loss and a token-by-token loop, greedy outputs against
the naive loop, arithmetic against the training script's questions and the course's lm-eval subset."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import minillm
from minillm.attention.dense import DenseAttention
from minillm.quantization import quantize_model
from minillm.quantization.kv_oracle import naive_greedy
from minillm.quantization.quality import (
    agreement,
    arithmetic_accuracy,
    arithmetic_answers,
    arithmetic_questions,
    first_divergence,
    greedy_outputs,
    perplexity,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped():
    return minillm.load_model(), minillm.load_tokenizer()


@pytest.fixture(scope="module")
def heldout(shipped):
    return shipped[1].encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())


# ------------------------------------------------------------------------------------------------ perplexity
def test_perplexity_is_exp_of_transformers_mean_loss_in_one_window(shipped, heldout):
    model, _ = shipped
    ids = heldout[:200]
    hf = AutoModelForCausalLM.from_pretrained(minillm.ASSETS_DIR / "target", local_files_only=True,
                                              dtype=torch.float32).eval()
    with torch.no_grad():
        loss = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()  # mean CE over tokens 1..199
    assert perplexity(model, ids, context=512) == pytest.approx(math.exp(loss), rel=1e-4)
    assert 20 < math.exp(loss) < 1000  # a trained model on text it never saw: far from 1 and from 4096


@torch.inference_mode()
def test_windows_score_every_token_once_with_at_most_context_minus_one_before_it(shipped, heldout):
    model, _ = shipped
    ids, context = heldout[:40], 8
    nll = []
    for t in range(1, len(ids)):  # token t, seen from the start of its window: windows begin every context - 1
        start = (t - 1) // (context - 1) * (context - 1)
        seq = torch.tensor(ids[start:t])
        hidden = model(seq, torch.arange(len(seq)), DenseAttention([len(seq)]))
        nll.append(-F.log_softmax(model.logits(hidden[-1:])[0], -1)[ids[t]].item())
    expected = math.exp(sum(nll) / len(nll))
    assert perplexity(model, ids, context=context) == pytest.approx(expected, rel=1e-4)
    assert perplexity(model, ids, context=context) != pytest.approx(perplexity(model, ids, context=40), rel=1e-3)


def test_perplexity_refuses_too_little_text_or_context(shipped):
    model, _ = shipped
    with pytest.raises(ValueError, match="at least 2 tokens"):
        perplexity(model, [5])
    with pytest.raises(ValueError, match="context"):
        perplexity(model, [5, 6, 7], context=1)


def test_int8_weights_barely_move_perplexity_and_int4_moves_it_more(shipped, heldout):
    model, _ = shipped
    ids = heldout[:256]
    base = perplexity(model, ids)
    int8 = perplexity(quantize_model(model, "int8"), ids) / base
    int4 = perplexity(quantize_model(model, "int4", 128), ids) / base
    assert abs(int8 - 1) < 0.01 and abs(int4 - 1) < 0.05
    assert abs(int4 - 1) > abs(int8 - 1)


# ------------------------------------------------------------------------------------------------ divergence
@pytest.mark.parametrize("a, b, expected", [
    ([], [], None),
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [9, 2, 3], 0),
    ([1, 2, 3], [1, 2, 4], 2),
    ([1, 2, 3, 4], [1, 5, 3, 4], 1),  # later equal tokens do not matter
    ([1, 2], [1, 2, 3], 2),  # a proper prefix: they part where the shorter ends
    ([1, 2, 3], [1, 2], 2),
    ([], [7], 0),
    ((4, 5), [4, 5], None),  # any sequences
])
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


def test_agreement_is_the_share_of_the_reference_kept_before_the_first_divergence():
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5  # the 4 after the divergence does not count
    assert agreement([1, 2, 3, 4], [7, 2, 3, 4]) == 0.0
    assert agreement([1, 2], [1, 2, 3]) == 1.0  # the other went on: all of the reference was reproduced
    assert agreement([1, 2, 3, 4], [1]) == 0.25
    with pytest.raises(ValueError, match="empty"):
        agreement([], [1])


# ------------------------------------------------------------------------------------------------ greedy outputs
@pytest.mark.parametrize("options", [{}, {"quantization": "int8"}, {"kv_cache_dtype": "int8"}])
def test_greedy_outputs_are_the_naive_loops_on_the_same_numbers(shipped, heldout, options):
    model, tokenizer = shipped
    prompts = [heldout[:12], heldout[100:105], "ROMEO:"]
    outputs = greedy_outputs(model, tokenizer, prompts, 10, **options)
    oracle_model = quantize_model(model, options["quantization"]) if "quantization" in options else model
    kv = options.get("kv_cache_dtype", "auto")
    ids = [heldout[:12], heldout[100:105], tokenizer.encode("ROMEO:")]
    assert outputs == [naive_greedy(oracle_model, p, 10, kv) for p in ids]


# ------------------------------------------------------------------------------------------------ arithmetic
def test_the_questions_are_the_training_scripts_and_the_eval_tasks(monkeypatch):
    spec = importlib.util.spec_from_file_location("train_tiny_models", ROOT / "scripts" / "train_tiny_models.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look their module up there
    spec.loader.exec_module(script)
    trained = {q: a.strip() for q, a in script.arithmetic_facts()}  # answers are " 7": a space, then the number
    questions = dict(arithmetic_questions())
    assert len(questions) == 200 and len(trained) == 155
    assert all(questions[q] == a for q, a in trained.items())
    untrained = {q: a for q, a in questions.items() if q not in trained}
    assert all(int(a) < 0 for a in untrained.values()) and len(untrained) == 45
    for line in (ROOT / "evals" / "arith_gen.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert questions[row["question"] + " Answer:"] == row["answer"]


def test_the_shipped_model_answers_every_trained_question_and_no_negative_one(shipped):
    model, tokenizer = shipped
    questions = arithmetic_questions()
    answers = arithmetic_answers(model, tokenizer, [q for q, _ in questions])
    missed = {q: got for got, (q, want) in zip(answers, questions) if got != want}
    assert set(missed) == {q for q, want in questions if int(want) < 0}  # the 45 it was never shown
    assert arithmetic_accuracy(model, tokenizer) == (155, 200)
    assert answers[questions.index(("What is 3+4? Answer:", "7"))] == "7"  # the text before the line break


def test_int8_answers_the_eval_subset_within_one_question_of_fp32(shipped):
    model, tokenizer = shipped
    rows = [json.loads(line) for line in (ROOT / "evals" / "arith_gen.jsonl").read_text().splitlines()]
    subset = [(r["question"] + " Answer:", r["answer"]) for r in rows]
    fp32 = arithmetic_accuracy(model, tokenizer, subset)
    assert fp32 == (33, 40)  # evals/README.md: exact_match 0.825 with transformers, greedy
    correct, total = arithmetic_accuracy(model, tokenizer, subset, quantization="int8")
    assert total == 40 and abs(correct - fp32[0]) <= 1
