"""What quantization costs in quality, measured (chapter 12): perplexity, greedy agreement, arithmetic.

Three yardsticks, from the cheapest to the one a user notices:

    perplexity           exp of the mean next-token cross-entropy on a text the model did not train on:
                         a small change in every logit shows here first
    greedy agreement     the same prompts decoded greedily by a float engine and a quantized one, and
                         where their tokens first part: after that the two texts go separate ways
    arithmetic accuracy  the shipped target's one skill with a right answer: single-digit sums and
                         differences, asked exactly as it was trained (`What is 3+4? Answer: 7`)

Every function takes the model as it is (float, or quantized by `quantize_model`); the engine-based ones
also take `EngineConfig` options, so `greedy_outputs(model, tok, prompts, 256, quantization="int8")` or
`kv_cache_dtype="fp8"` quantizes inside the engine instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from minillm.attention.dense import DenseAttention
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.model.decoder import CausalLM
from minillm.sampling import SamplingParams

Prompt = str | Sequence[int]


@torch.inference_mode()
def perplexity(model: CausalLM, token_ids: Sequence[int], context: int = 512) -> float:
    """exp(mean cross-entropy) of each token given the ones before it, computed directly on the model.

    The text is cut into windows of at most `context` tokens that overlap by one token, so that every
    token after the first is scored exactly once, seeing at most `context - 1` tokens before it (the
    window's start). Needs at least two tokens."""
    ids = list(token_ids)
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(ids)}")
    if context < 2:
        raise ValueError(f"context must be at least 2 tokens, got {context}")
    total_nll, scored = 0.0, 0
    start = 0
    while start < len(ids) - 1:
        window = torch.tensor(ids[start:start + context], device=model.device)
        positions = torch.arange(len(window), device=model.device)
        hidden = model(window, positions, DenseAttention([len(window)]))
        logits = model.logits(hidden[:-1])  # row i predicts window[i + 1]
        total_nll += F.cross_entropy(logits.float(), window[1:], reduction="sum").item()
        scored += len(window) - 1
        start += context - 1  # the window's last token starts the next one: it is context, not scored twice
    return math.exp(total_nll / scored)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The index of the first position where `a` and `b` hold different tokens.

    None when the two are equal (same length, same tokens). When one is a proper prefix of the other,
    they part where the shorter ends: its length."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(reference: Sequence[int], other: Sequence[int]) -> float:
    """The share of `reference`'s tokens that `other` reproduces before their first divergence (1.0 when
    `other` starts with all of `reference`). Positions after a divergence are not compared: from there the
    two texts are conditioned on different tokens, and matching by position would mean nothing."""
    if not reference:
        raise ValueError("the reference generation is empty")
    cut = first_divergence(reference, other)
    return 1.0 if cut is None or cut >= len(reference) else cut / len(reference)


def greedy_outputs(model: CausalLM, tokenizer, prompts: Sequence[Prompt], max_new_tokens: int,
                   **engine_options) -> list[list[int]]:
    """Each prompt's `max_new_tokens` greedy tokens (the end-of-text token ignored), all decoded together by
    one paged `LLMEngine` built with `engine_options` (e.g. quantization="int8", kv_cache_dtype="fp8")."""
    ids = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    return _run(model, tokenizer, ids, params, engine_options)


def _run(model: CausalLM, tokenizer, ids: list[list[int]], params: SamplingParams,
         engine_options: dict) -> list[list[int]]:
    """Each prompt's output tokens under `params`, all through one paged engine. A prompt the engine refuses
    (or an interrupt) aborts the requests already added before the error goes on: the engine is left idle."""
    if not ids:
        raise ValueError("prompts is empty: give at least one prompt")
    options = {"kv": "paged", "max_num_seqs": len(ids),
               "max_model_len": max(len(p) for p in ids) + params.max_new_tokens, **engine_options}
    engine = LLMEngine(model, tokenizer, EngineConfig(**options))
    try:
        return engine_outputs(engine, ids, params)
    finally:
        engine.close()


def engine_outputs(engine: LLMEngine, ids: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
    """Each prompt's output tokens under `params`, through `engine`, the requests released after. A prompt the
    engine refuses (or an interrupt) aborts the requests already added before the error goes on: the engine is
    left idle."""
    try:
        request_ids = [engine.add_request(list(p), params).request_id for p in ids]
        while engine.has_unfinished():
            engine.step()
        outputs = [list(engine.output(i).token_ids) for i in request_ids]
        for i in request_ids:
            engine.release(i)
        return outputs
    finally:
        for i in engine.unfinished_ids():
            engine.abort(i)


def arithmetic_questions() -> list[tuple[str, str]]:
    """Every single-digit addition and subtraction (200), as (prompt, answer): `What is 4-5? Answer:`, "-1".

    The prompt is the exact form the target was trained on (scripts/train_tiny_models.py); it was trained on
    the 100 additions and the 55 subtractions with a non-negative answer, and has never seen a negative one."""
    adds = [(f"What is {a}+{b}? Answer:", str(a + b)) for a in range(10) for b in range(10)]
    subs = [(f"What is {a}-{b}? Answer:", str(a - b)) for a in range(10) for b in range(10)]
    return adds + subs


def arithmetic_answers(model: CausalLM, tokenizer, prompts: Sequence[str], max_new_tokens: int = 8,
                       **engine_options) -> list[str]:
    """The model's greedy answer to each prompt: its text up to the first line break, stripped — as the
    course's lm-eval task (evals/minillm_arith_gen.yaml) reads it. All prompts run in one engine."""
    ids = [tokenizer.encode(p) for p in prompts]
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, stop=("\n",))
    tokens = _run(model, tokenizer, ids, params, engine_options)
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    return [text.split("\n", 1)[0].strip() for text in texts]


def arithmetic_accuracy(model: CausalLM, tokenizer, questions: Sequence[tuple[str, str]] | None = None,
                        **engine_options) -> tuple[int, int]:
    """(correct, total): exact matches of the greedy answer on `questions` (default: all 200 of
    `arithmetic_questions()`), batched through one engine built with `engine_options`."""
    questions = list(arithmetic_questions() if questions is None else questions)
    answers = arithmetic_answers(model, tokenizer, [q for q, _ in questions], **engine_options)
    return sum(got == want for got, (_, want) in zip(answers, questions)), len(questions)
