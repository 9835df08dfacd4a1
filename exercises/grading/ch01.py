"""Chapter 1's cases: `ch01.top_p` (nucleus filtering) and `ch01.kv_decode` (the cached loop)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from exercises.grading.core import call, exercise, expect, fail

# ----------------------------------------------------------------------------- ch01.top_p

top_p = exercise("ch01.top_p", "ch01_top_p", "top_p_filter")


def _filter(impl: Any, logits: torch.Tensor, p: float, given: str) -> torch.Tensor:
    """impl(a copy of logits, p), checked to be a tensor of the input's shape."""
    want = f"a tensor of shape {tuple(logits.shape)}"
    got = call(given, want, impl, logits.clone(), p)
    is_tensor = isinstance(got, torch.Tensor)
    expect(is_tensor and got.shape == logits.shape, given, want,
           f"a tensor of shape {tuple(got.shape)}" if is_tensor else repr(got))
    return got


def _kept_probs(logits: torch.Tensor, kept: torch.Tensor) -> list[float]:
    return [round(p, 3) for p in logits.softmax(-1)[kept].tolist()]


def _small_case(impl: Any, probs: list[float], p: float, keep: list[bool]) -> None:
    logits = torch.tensor(probs).log()
    given = f"probabilities {probs} (logits: their log), top_p={p}"
    got = _filter(impl, logits, p, given)
    want = torch.tensor(keep)
    expect(torch.equal(torch.isfinite(got), want), given, f"to keep probabilities {_kept_probs(logits, want)}",
           f"kept {_kept_probs(logits, torch.isfinite(got))}")


@top_p.case
def keeps_the_token_that_crosses_the_boundary(impl: Callable) -> None:
    # ascending 0.05, 0.15 | 0.3, 0.5: 0.05 + 0.15 = 0.2 <= 0.4 dropped; adding 0.3 would pass 0.4
    _small_case(impl, [0.05, 0.5, 0.15, 0.3], 0.6, [False, True, False, True])


@top_p.case
def drops_tokens_that_with_all_less_likely_hold_at_most_1_minus_top_p(impl: Callable) -> None:
    """drops a token when it and every less likely token sum to at most 1 - top_p"""
    # exact in float32: 0.125 + 0.125 = 0.25 = 1 - 0.75, so both 0.125s go ("at most", not "less than")
    _small_case(impl, [0.125, 0.5, 0.125, 0.25], 0.75, [False, True, False, True])


@top_p.case
def always_keeps_the_most_likely_token(impl: Callable) -> None:
    for logits in (torch.tensor([2.0, 0.0, 1.0, -1.0, 0.5]), torch.tensor([1.5, -0.3, -2.2, 0.6, -1.1, -1.4, 0.4])):
        given = f"logits {logits.tolist()}, top_p=0.0"
        got = _filter(impl, logits, 0.0, given)
        want = torch.zeros_like(logits, dtype=torch.bool)
        want[logits.argmax()] = True
        expect(torch.equal(torch.isfinite(got), want), given, f"only the most likely token (index "
               f"{int(logits.argmax())}) kept", f"kept indices {torch.isfinite(got).nonzero().flatten().tolist()}")


@top_p.case
def top_p_one_keeps_everything(impl: Callable) -> None:
    logits = torch.tensor([0.0, -1e4, 3.0, 1.0])  # token 1's probability rounds to 0
    given = f"logits {logits.tolist()}, top_p=1.0"
    got = _filter(impl, logits, 1.0, given)
    expect(torch.equal(got, logits), given, f"the logits unchanged {logits.tolist()}", got.tolist())


@top_p.case
def dropped_logits_are_minus_infinity(impl: Callable) -> None:
    logits = torch.tensor([0.05, 0.5, 0.15, 0.3]).log()
    given = "probabilities [0.05, 0.5, 0.15, 0.3] (logits: their log), top_p=0.6"
    got = _filter(impl, logits, 0.6, given)
    expect(got[0] == -torch.inf and got[2] == -torch.inf, given,
           "-inf at the dropped tokens 0 and 2", f"{got[0].item()} and {got[2].item()}")


@top_p.case
def kept_logits_are_unchanged(impl: Callable) -> None:
    logits = torch.tensor([0.05, 0.5, 0.15, 0.3]).log()
    given = "probabilities [0.05, 0.5, 0.15, 0.3] (logits: their log), top_p=0.6"
    got = _filter(impl, logits, 0.6, given)
    expect(torch.equal(got[[1, 3]], logits[[1, 3]]), given, f"the kept logits unchanged {logits[[1, 3]].tolist()}",
           got[[1, 3]].tolist())


@top_p.case
def filters_each_row_of_a_batch_on_its_own(impl: Callable) -> None:
    rows = torch.randn(3, 12, generator=torch.Generator().manual_seed(3)) * torch.tensor([[0.5], [2.0], [4.0]])
    got = _filter(impl, rows, 0.7, "a (3, 12) batch of logits, top_p=0.7")
    for i, row in enumerate(rows):
        alone = _filter(impl, row, 0.7, f"row {i} of that batch alone, top_p=0.7")
        expect(torch.equal(torch.isfinite(got[i]), torch.isfinite(alone)), f"row {i} of a (3, 12) batch, top_p=0.7",
               f"the tokens kept when filtering that row alone {torch.isfinite(alone).nonzero().flatten().tolist()}",
               f"kept {torch.isfinite(got[i]).nonzero().flatten().tolist()}")


def _hf_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    from transformers.generation.logits_process import TopPLogitsWarper

    return TopPLogitsWarper(top_p=p)(None, logits.clone())


@top_p.case
def matches_transformers_on_random_logits(impl: Callable) -> None:
    for seed, p in enumerate([0.1, 0.5, 0.8, 0.95]):
        logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(seed)) * 2
        given = f"torch.randn(6, 500) * 2 (seed {seed}), top_p={p}"
        kept, want = torch.isfinite(_filter(impl, logits, p, given)), torch.isfinite(_hf_top_p(logits, p))
        for row in range(6):
            if not torch.equal(kept[row], want[row]):
                token = int((kept[row] != want[row]).nonzero()[0])
                fail(f"{given}, row {row}", f"{int(want[row].sum())} tokens kept (as transformers' TopPLogitsWarper)",
                     f"{int(kept[row].sum())} kept; token {token} (probability {logits[row].softmax(-1)[token]:.4f}) "
                     f"should be {'kept' if want[row, token] else 'dropped'}")


# ----------------------------------------------------------------------------- ch01.kv_decode

kv_decode = exercise("ch01.kv_decode", "ch01_kv_decode", "greedy_decode_with_cache", time_limit_s=30)


class _Recorder:
    """A model that records what each forward pass was fed (and insists on 1-D tensors)."""

    def __init__(self, model: torch.nn.Module):
        self._model = model
        self.fed: list[int] = []
        self.positions: list[list[int]] = []

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: Any) -> torch.Tensor:
        for arg, value in (("input_ids", input_ids), ("positions", positions)):
            if not isinstance(value, torch.Tensor) or value.dim() != 1:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                fail(f"forward pass {len(self.fed) + 1}, model(input_ids, positions, backend)",
                     f"{arg} as a 1-D tensor", shape)
        self.fed.append(int(input_ids.shape[0]))
        self.positions.append(positions.tolist())
        return self._model(input_ids, positions, backend)

    forward = __call__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@functools.cache
def _cached_tiny_model() -> torch.nn.Module:
    from minillm.model import CausalLM, ModelConfig

    config = ModelConfig(family="qwen3", vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=256, qk_norm=True)
    torch.manual_seed(0)
    model = CausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


def tiny_model() -> torch.nn.Module:
    """A tiny random Qwen3, a fresh copy for each case (the learner's code cannot spoil the cache)."""
    return copy.deepcopy(_cached_tiny_model())


@functools.cache
def _cached_shipped_model() -> tuple[torch.nn.Module, Any]:
    from minillm.model import load

    return load("target", device="cpu")


def _naive(prompt: tuple[int, ...], n: int) -> list[int]:
    """Chapter 1's naive loop on the tiny model: the tokens a correct answer must give."""
    return list(_cached_naive(prompt, n))


@functools.cache
def _cached_naive(prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    from minillm.generate import generate_without_cache
    from minillm.sampling import SamplingParams

    class _Ids:  # the loop needs a tokenizer only to detokenise; ids are enough here
        def decode(self, ids: list[int], **_: Any) -> str:
            return ""

    params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
    return tuple(generate_without_cache(tiny_model(), _Ids(), list(prompt), params).token_ids)


def _decode(impl: Any, model: Any, prompt: list[int], n: int, expected: str) -> list[int]:
    given = f"prompt {prompt}, max_new_tokens={n}"
    got = call(given, expected, impl, model, list(prompt), n)
    expect(isinstance(got, list) and all(isinstance(t, int) for t in got), given, "a list of ints", repr(got))
    return got


@kv_decode.case
def prefills_once_then_feeds_one_token_per_pass(impl: Callable) -> None:
    model = _Recorder(tiny_model())
    want = [5, 1, 1, 1, 1, 1]
    _decode(impl, model, [1, 2, 3, 4, 5], 6, f"passes fed {want} tokens")
    expect(model.fed == want, "prompt [1, 2, 3, 4, 5], max_new_tokens=6",
           f"tokens fed per forward pass {want} (the prompt once, then only the newest token)", model.fed)


@kv_decode.case
def each_pass_gets_the_positions_of_the_tokens_it_feeds(impl: Callable) -> None:
    model = _Recorder(tiny_model())
    want = [[0, 1, 2, 3, 4], [5], [6], [7]]
    _decode(impl, model, [1, 2, 3, 4, 5], 4, f"positions {want}")
    expect(model.positions == want, "prompt [1, 2, 3, 4, 5], max_new_tokens=4", f"positions per pass {want}",
           model.positions)


@kv_decode.case
def returns_exactly_max_new_tokens(impl: Callable) -> None:
    for n in (1, 7, 0):
        tokens = f"{n} token" + "s" * (n != 1)
        got = _decode(impl, _Recorder(tiny_model()), [3, 1, 4, 1, 5], n, tokens)
        expect(len(got) == n, f"prompt [3, 1, 4, 1, 5], max_new_tokens={n}", tokens, f"{len(got)}: {got}")


@kv_decode.case
def never_stops_early_even_at_an_end_of_sequence_token(impl: Callable) -> None:
    model, prompt = tiny_model(), [9, 8, 7]
    want = _naive(tuple(prompt), 8)
    model.config = dataclasses.replace(model.config, eos_token_ids=(want[2],))
    got = _decode(impl, _Recorder(model), prompt, 8, f"{want}")
    expect(len(got) == 8, f"prompt {prompt}, max_new_tokens=8, model.config.eos_token_ids=({want[2]},) "
           f"(the 3rd token the model produces)", "8 tokens: no stop at the end-of-sequence token",
           f"{len(got)} tokens: {got}")


@kv_decode.case
def equals_the_naive_loop_on_a_random_model(impl: Callable) -> None:
    prompt = [5, 17, 99, 3, 250, 41, 7]
    want = _naive(tuple(prompt), 20)
    got = _decode(impl, _Recorder(tiny_model()), prompt, 20, f"{want}")
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        where = (f"{len(got)} tokens instead of {len(want)}" if first == min(len(got), len(want)) else
                 "new token 0 is the argmax of the prefill's LAST position" if first == 0 else
                 "decode passes feed the newest token at its position, the cache holding all before it")
        fail(f"prompt {prompt}, max_new_tokens=20", f"the naive loop's tokens {want}",
             f"{got}, first difference at new token {first} ({where})")


@kv_decode.case
def answers_one_plus_one_with_the_shipped_model(impl: Callable) -> None:
    shipped, tokenizer = _cached_shipped_model()
    ids = tokenizer.encode("What is 1+1? Answer:")
    got = _decode(impl, _Recorder(copy.deepcopy(shipped)), ids, 3, "a text starting with '2'")
    text = tokenizer.decode(got)
    expect(text.strip().startswith("2"), "'What is 1+1? Answer:', max_new_tokens=3", "a text starting with '2'",
           repr(text))
