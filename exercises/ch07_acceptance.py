"""Chapter 7 exercise `ch07.acceptance`: the acceptance rule of speculative decoding."""

from collections.abc import Callable


def accept_drafts(drafted: list[int], p: list[list[float]], q: list[list[float]] | None, uniforms: list[float],
                  draw: Callable[[list[float]], int]) -> list[int]:
    """The tokens the target keeps from one verification. Return them: the accepted guesses, then one
    token of the target's.

    drafted:  the proposer's k guesses d_1 .. d_k (token ids).
    p:        k + 1 target distributions (lists of probabilities over the vocabulary): p[i] is the
              target's distribution for the token at guess i's place; p[k] the one after all k.
    q:        the k proposer distributions the guesses were drawn from, or None for a proposer that
              guesses without one (n-gram lookup): then q[i] is one-hot at drafted[i].
    uniforms: k random numbers in [0, 1): uniforms[i] decides guess i.
    draw:     draw(distribution) samples a token from a list of probabilities summing to 1.
    Rules, for i = 0, 1, ...:
      accept drafted[i] if uniforms[i] < min(1, p[i][d] / q[i][d]) (d = drafted[i]);
      at the first rejection: return the accepted ones + [draw(residual)], residual = max(0, p[i] - q[i])
      element by element, divided by its sum (the sum can be 0 only through rounding, when p = q:
      then use p[i]);
      if all k are accepted: return them + [draw(p[k])] (the bonus token).
    Call draw exactly once. Do not modify the arguments.
    """
    raise NotImplementedError("ch07.acceptance: keep the guesses the target accepts, then draw one token")
