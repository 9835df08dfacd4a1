"""Log-probabilities of tokens: how sure the model was of each token, and what else it considered.

Which distribution: the model's own, `log_softmax(logits)` of the raw logits, before any bias,
penalty, temperature or filter touched them (vLLM's default, "raw logprobs"). So the numbers are
the same whatever a request's sampling settings, and equal to Hugging Face transformers'
`log_softmax(model(ids).logits)`. A token chosen under penalties or at a high temperature can thus
be one the model itself ranked low: its `rank` says so.

    position:        0        1         2
    prompt:         "The"    " cat"    " sat"
    prompt logprob:  None    log p(" cat" | "The")    log p(" sat" | "The cat")     (the first has no context)

Computed for a whole batch of rows at once: one log-softmax, one gather, one top-k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and its most likely alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1 for the model's most likely token
    top: tuple[tuple[int, float], ...]  # (token id, logprob) of the most likely tokens, most likely first


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]) -> list[TokenLogprob]:
    """For each row of `logits` (rows, vocab), the logprob and rank of `token_ids[row]` and the
    `num_top[row]` most likely tokens. One batched computation; one copy to the host."""
    if not len(token_ids):
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (rows, vocab)
    chosen_ids = torch.tensor(list(token_ids), dtype=torch.long, device=logits.device).unsqueeze(1)
    chosen = logprobs.gather(1, chosen_ids)  # (rows, 1)
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # (rows,)
    k = min(max(num_top), logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], chosen_ids[:, :0])
    chosen, ranks, top_values, top_ids = (t.tolist() for t in (chosen.squeeze(1), ranks, top_values, top_ids))
    return [TokenLogprob(int(token), value, rank, tuple(zip(ids[:n], values[:n])))
            for token, value, rank, ids, values, n in zip(token_ids, chosen, ranks, top_ids, top_values, num_top)]
