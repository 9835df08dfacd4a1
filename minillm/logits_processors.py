"""What changes the model's logits before a token is chosen: a bias, penalties, and min_tokens.

One step's rows (rows, vocab), each with its own settings and its own history, processed at once:

    logits + logit_bias                                   OpenAI's logit_bias (HF: SequenceBiasLogitsProcessor)
    repetition penalty, on tokens of prompt or output:    x > 0 ─► x / p,  x < 0 ─► x * p    (HF: Repetition-
                                                          PenaltyLogitsProcessor; vLLM the same)
    - frequency x count(t in output) - presence x [t in output]     (OpenAI's formula; output tokens only)
    -inf on EOS and the stop tokens while fewer than min_tokens were generated   (HF: MinNewTokensLength-
                                                                                  LogitsProcessor; vLLM the same)

Penalties read each row's tokens: every (row, token) seen becomes one cell of the flattened
(rows, vocab) logits, and only those cells are read and written, in one batched pass whatever the
rows ask for (a few hundred cells per row, where a dense pass would touch the whole vocabulary). A
row that asks for nothing costs nothing, and a step where no row asks for anything returns the
logits untouched (the decode step's cost is unchanged when every parameter is off:
benchmarks/sampling_overhead.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from minillm.sampling import SamplingParams


@dataclass(frozen=True)
class RowHistory:
    """What one row's processors look at: its request's settings and tokens so far."""

    params: SamplingParams
    prompt_ids: Sequence[int] | torch.Tensor  # a 1-D tensor: the prompt's distinct ids, made once (the runner's)
    output_ids: Sequence[int]  # generated before this row's token (with speculation: earlier guesses too)


def process_logits(logits: torch.Tensor, rows: Sequence[RowHistory], eos_token_ids: Collection[int]) -> torch.Tensor:
    """The processed logits (rows, vocab): a new tensor, or `logits` itself when no row changes them."""
    if not any(r.params.changes_logits for r in rows):
        return logits
    logits = logits.clone()
    _add_bias(logits, rows)
    _apply_penalties(logits, rows)
    _mask_until_min_tokens(logits, rows, eos_token_ids)
    return logits


def _add_bias(logits: torch.Tensor, rows: Sequence[RowHistory]) -> None:
    where = [(i, token, bias) for i, r in enumerate(rows) for token, bias in r.params.logit_bias]
    if not where:
        return
    index_rows, tokens, biases = zip(*where)
    device = logits.device
    logits.index_put_((torch.tensor(index_rows, device=device), torch.tensor(tokens, device=device)),
                      torch.tensor(biases, dtype=logits.dtype, device=device), accumulate=True)


def token_counts(token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in each list: (len(token_lists), vocab_size), int64 (a dense
    reference for tests and readers; the sampler itself works on `_occurrences`)."""
    cells, _ = _occurrences(token_lists, vocab_size, device)
    return torch.bincount(cells, minlength=len(token_lists) * vocab_size).view(len(token_lists), vocab_size)


def _occurrences(token_lists: Sequence[Sequence[int] | torch.Tensor], vocab_size: int, device: torch.device,
                 rows: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token of every list as its cell of a flattened (rows, vocab) matrix, row * vocab +
    token, and the row of each: two 1-D tensors of sum(len) entries. List i lies in row rows[i]
    (default: i). Python lists are read in one pass (numpy reads ints fastest); tensors are joined."""
    rows = list(rows) if rows is not None else list(range(len(token_lists)))
    order = ([i for i, t in enumerate(token_lists) if not isinstance(t, torch.Tensor)]
             + [i for i, t in enumerate(token_lists) if isinstance(t, torch.Tensor)])  # lists first, then tensors
    listed = [token_lists[i] for i in order if not isinstance(token_lists[i], torch.Tensor)]
    lengths = torch.tensor([len(token_lists[i]) for i in order], dtype=torch.long)
    parts = [torch.from_numpy(np.fromiter(itertools.chain.from_iterable(listed), dtype=np.int64,
                                          count=sum(map(len, listed))))]
    parts += [token_lists[i].cpu() for i in order[len(listed):]]
    row = torch.repeat_interleave(torch.tensor([rows[i] for i in order], dtype=torch.long), lengths)
    return (row * vocab_size + torch.cat(parts)).to(device), row.to(device)


def _apply_penalties(logits: torch.Tensor, rows: Sequence[RowHistory]) -> None:
    """Only the cells of tokens a row has seen change, so only those are read and written: a few
    hundred per row, where the vocabulary has tens of thousands (a dense (rows, vocab) pass per
    operation would cost more than the rest of the sampler)."""
    chosen = [i for i, r in enumerate(rows) if r.params.has_penalties]
    if not chosen:
        return
    vocab, device, dtype = logits.shape[-1], logits.device, logits.dtype
    flat = logits.view(-1)  # (rows * vocab,): cell row * vocab + token

    def per_row(name: str) -> torch.Tensor:  # (len(rows),): each row's value of a penalty
        return torch.tensor([getattr(r.params, name) for r in rows], dtype=dtype, device=device)

    repeating = [i for i in chosen if rows[i].params.repetition_penalty != 1.0]
    if repeating:  # HF's rule on every token of prompt or output: x > 0 ─► x / p, x < 0 ─► x * p
        cells, row = _occurrences([rows[i].output_ids for i in repeating] + [rows[i].prompt_ids for i in repeating],
                                  vocab, device, repeating * 2)
        seen = flat[cells]  # a token seen twice is read twice and written twice, with the same value
        penalty = per_row("repetition_penalty")[row]
        # a tiny repetition penalty (1e-38 is allowed) can push a logit past float32's range: +inf would make
        # softmax NaN, so it stops at the largest finite value (the token is then certain, as it should be)
        flat[cells] = torch.where(seen < 0, seen * penalty, seen / penalty).clamp(max=torch.finfo(dtype).max)
    openai = [i for i in chosen if rows[i].params.frequency_penalty or rows[i].params.presence_penalty]
    if openai:  # OpenAI's: x - frequency * count - presence * [count > 0], counting the output's tokens only
        cells, _ = _occurrences([rows[i].output_ids for i in openai], vocab, device, openai)
        cells, counts = torch.unique(cells, return_counts=True)  # each generated token once, with its count
        row = cells // vocab
        flat[cells] = flat[cells] - per_row("frequency_penalty")[row] * counts - per_row("presence_penalty")[row]


def _mask_until_min_tokens(logits: torch.Tensor, rows: Sequence[RowHistory], eos_token_ids: Collection[int]) -> None:
    where = [(i, token) for i, r in enumerate(rows) if len(r.output_ids) < r.params.min_tokens
             for token in stopping_tokens(r.params, eos_token_ids) if token < logits.shape[-1]]
    if where:
        index_rows, tokens = zip(*where)
        logits[list(index_rows), list(tokens)] = float("-inf")


def stopping_tokens(params: SamplingParams, eos_token_ids: Collection[int]) -> tuple[int, ...]:
    """The tokens that would end the request: its stop tokens, and EOS unless it ignores EOS."""
    return tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(eos_token_ids))
