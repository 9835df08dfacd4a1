"""What changes the model's logits before a token is chosen: a bias, penalties, and min_tokens.

One step's rows (rows, vocab), each with its own settings and its own history, processed at once:

    logits + logit_bias                                   OpenAI's logit_bias (HF: SequenceBiasLogitsProcessor)
    repetition penalty, on tokens of prompt or output:    x > 0 ─► x / p,  x < 0 ─► x * p    (HF: Repetition-
                                                          PenaltyLogitsProcessor; vLLM the same)
    - frequency x count(t in output) - presence x [t in output]     (OpenAI's formula; output tokens only)
    -inf on EOS and the stop tokens while fewer than min_tokens were generated   (HF: MinNewTokensLength-
                                                                                  LogitsProcessor; vLLM the same)

Counting needs each row's tokens; they are scattered into one (rows, vocab) count matrix per step,
so the work is one batched pass whatever the rows ask for. A row that asks for nothing costs nothing,
and a step where no row asks for anything returns the logits untouched (the decode step's cost is
unchanged when every parameter is off).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from minillm.sampling import SamplingParams


@dataclass(frozen=True)
class RowHistory:
    """What one row's processors look at: its request's settings and tokens so far."""

    params: SamplingParams
    prompt_ids: Sequence[int]
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
    """How often each token occurs in each list: (len(token_lists), vocab_size), int32."""
    longest = max((len(t) for t in token_lists), default=0)
    padded = torch.full((len(token_lists), max(longest, 1)), vocab_size, dtype=torch.long)  # pad: a spare column
    for i, tokens in enumerate(token_lists):
        padded[i, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
    counts = torch.zeros(len(token_lists), vocab_size + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, padded.to(device), torch.ones_like(padded, dtype=torch.int32, device=device))
    return counts[:, :vocab_size]


def _apply_penalties(logits: torch.Tensor, rows: Sequence[RowHistory]) -> None:
    chosen = [i for i, r in enumerate(rows) if r.params.has_penalties]
    if not chosen:
        return
    vocab, device, dtype = logits.shape[-1], logits.device, logits.dtype
    picked = [rows[i] for i in chosen]
    index = torch.tensor(chosen, device=device)
    sub = logits[index]  # (len(chosen), vocab)
    output_counts = token_counts([r.output_ids for r in picked], vocab, device)  # (len(chosen), vocab)
    seen = (token_counts([r.prompt_ids for r in picked], vocab, device) > 0) | (output_counts > 0)

    def column(name: str) -> torch.Tensor:  # (len(chosen), 1)
        return torch.tensor([getattr(r.params, name) for r in picked], dtype=dtype, device=device).unsqueeze(1)

    penalty = column("repetition_penalty")
    sub = torch.where(seen, torch.where(sub < 0, sub * penalty, sub / penalty), sub)
    sub = sub - column("frequency_penalty") * output_counts - column("presence_penalty") * (output_counts > 0)
    # a tiny repetition penalty (1e-38 is allowed) can push a logit past float32's range: +inf would make
    # softmax NaN, so it stops at the largest finite value (the token is then certain, as it should be)
    logits[index] = sub.clamp(max=torch.finfo(dtype).max)


def _mask_until_min_tokens(logits: torch.Tensor, rows: Sequence[RowHistory], eos_token_ids: Collection[int]) -> None:
    where = [(i, token) for i, r in enumerate(rows) if len(r.output_ids) < r.params.min_tokens
             for token in stopping_tokens(r.params, eos_token_ids) if token < logits.shape[-1]]
    if where:
        index_rows, tokens = zip(*where)
        logits[list(index_rows), list(tokens)] = float("-inf")


def stopping_tokens(params: SamplingParams, eos_token_ids: Collection[int]) -> tuple[int, ...]:
    """The tokens that would end the request: its stop tokens, and EOS unless it ignores EOS."""
    return tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(eos_token_ids))
