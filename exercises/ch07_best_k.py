"""Chapter 7 exercise `ch07.best_k`: how many guesses to ask for, from an acceptance rate and costs."""


def best_k(alpha: float, draft_cost: float, verify_cost: list[float]) -> int:
    """The number of guesses per round, k, that makes decoding fastest; 0 when no k beats plain decoding.

    alpha:       the chance that a guess is kept when every guess before it was (0 <= alpha <= 1),
                 each guess independently: the alpha of section 1.
    draft_cost:  the cost of one draft pass, in target decode steps (>= 0).
    verify_cost: verify_cost[k] is the cost of one target pass over k + 1 tokens, in decode steps
                 (verify_cost[0] == 1: a plain decode step). k may be 0 .. len(verify_cost) - 1.
    A round with k guesses costs k draft passes and one target pass over k + 1 tokens, and yields on
    average the tokens per pass of section 1 (the kept guesses, then the target's own token). Plain
    decoding is k = 0: one token per decode step. Return the k with the most tokens per unit of time;
    among equally fast ones the smallest; 0 unless some k is strictly faster than plain decoding.
    Do not modify verify_cost. Errors: none to raise.
    """
    raise NotImplementedError("ch07.best_k: weigh the tokens a round yields against what its passes cost")
