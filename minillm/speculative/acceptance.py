"""The acceptance rule of speculative decoding: which drafted tokens the target keeps.

A proposer drafted k tokens d_1..d_k after a request's last token; one forward pass of the target
over [last, d_1, ..., d_k] gave k + 1 next-token distributions p_1..p_{k+1} (p_i: the target's
distribution for the token after d_{i-1}). Going left to right:

    accept d_i with probability min(1, p_i(d_i) / q_i(d_i))           q_i: the proposer's distribution
    on the first rejection: draw from  max(0, p_i - q_i) / sum(...)   and stop
    if all k are accepted: draw a bonus token from p_{k+1}

Every token emitted this way is distributed exactly as if the target had sampled it alone
(Leviathan et al., 2023; Chen et al., 2023). A proposer that guesses without a distribution (n-gram
lookup) is the case q_i = one-hot(d_i). Greedy decoding is the limit where p_i is one-hot at the
target's argmax: accept while the guess equals it, then emit the argmax. Either way one target pass
yields between 1 and k + 1 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def accept_greedy(drafted: Sequence[int], target_argmax: Sequence[int]) -> list[int]:
    """The tokens greedy decoding keeps: the drafted ones while they equal the target's argmax, then
    the target's own token (its correction, or the bonus after k accepted). `target_argmax` has
    len(drafted) + 1 entries."""
    if len(target_argmax) != len(drafted) + 1:
        raise ValueError(f"need {len(drafted) + 1} target tokens for {len(drafted)} drafted, got {len(target_argmax)}")
    kept = []
    for guess, best in zip(drafted, target_argmax):
        if guess != best:
            return kept + [int(best)]
        kept.append(int(guess))
    return kept + [int(target_argmax[-1])]


def accept_sampled(drafted: Sequence[int], target_probs: torch.Tensor, draft_probs: torch.Tensor | None = None,
                   generator: torch.Generator | None = None) -> list[int]:
    """The tokens kept by the rejection rule.

    target_probs: (k + 1, vocab), the target's distributions (temperature, top-k and top-p already
    applied); draft_probs: (k, vocab), the proposer's distributions the drafted tokens were drawn
    from, or None for a proposer that guesses deterministically (one-hot q). Draws use `generator`
    (seeded runs are reproducible): k uniforms at once (one per guess, judged together: one host sync
    per request instead of three per guess), then one draw.
    """
    k = len(drafted)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs must be ({k + 1}, vocab), got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (k, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be ({k}, {target_probs.shape[1]}), got {tuple(draft_probs.shape)}")
    p = target_probs.float()
    if k:  # every guess judged at once: (k,) probabilities, (k,) uniforms, one look from the host
        rows, guesses = torch.arange(k, device=p.device), torch.tensor(list(drafted), device=p.device)
        p_guess = p[rows, guesses]
        q_guess = torch.ones_like(p_guess) if draft_probs is None else draft_probs[rows, guesses].float()
        u = torch.rand(k, generator=generator, device=p.device)
        accepted = (q_guess > 0) & (u < (p_guess / q_guess).clamp(max=1.0))  # q = 0: never drafted, never kept
        n = int(accepted.int().cumprod(0).sum())  # the guesses kept: those before the first rejection
    else:
        n = 0
    kept = [int(t) for t in drafted[:n]]
    if n == k:  # all kept: the bonus token, from the target's last distribution
        return kept + [int(torch.multinomial(p[k], 1, generator=generator))]
    q = torch.zeros_like(p[n]) if draft_probs is None else draft_probs[n].float()
    if draft_probs is None:
        q[drafted[n]] = 1.0
    residual = (p[n] - q).clamp(min=0)
    if float(residual.sum()) <= 0:  # p == q: rejection cannot happen in exact arithmetic; p is the answer
        residual = p[n]
    return kept + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
