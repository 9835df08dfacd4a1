"""Chapter 7's cases: `ch07.acceptance` (the rule that keeps or rejects guesses), `ch07.ngram`
(prompt lookup) and `ch07.best_k` (how many guesses pay, from an acceptance rate and costs)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from exercises.grading.core import call, exercise, expect
from minillm.speculative.ngram import propose_ngram

acceptance = exercise("ch07.acceptance", "ch07_acceptance", "accept_drafts")
ngram = exercise("ch07.ngram", "ch07_ngram", "propose_ngram")
best_k = exercise("ch07.best_k", "ch07_best_k", "best_k")

DRAWN = -1  # what the graders' `draw` returns: a marker, so that the distribution it was given can be checked


class Draw:
    """A `draw` that records every distribution it is asked to sample and returns `token`."""

    def __init__(self, token: int = DRAWN):
        self.token, self.calls = token, []

    def __call__(self, distribution: list[float]) -> int:
        self.calls.append([float(x) for x in distribution])
        return self.token


def _accept(impl: Any, drafted, p, q, uniforms, want: list[int], why: str, want_drawn: list[float] | None = None):
    draw = Draw()
    given = f"accept_drafts({drafted}, p={p}, q={q}, uniforms={uniforms})"
    got = call(given, f"{want} ({why})", impl, list(drafted), [list(r) for r in p],
               None if q is None else [list(r) for r in q], list(uniforms), draw)
    got = list(got) if isinstance(got, list | tuple) else got
    expect(got == want, given, f"{want} ({why}; {DRAWN} stands for the token `draw` returned)", repr(got))
    expect(len(draw.calls) == 1, given, "draw called exactly once", f"{len(draw.calls)} calls")
    if want_drawn is not None:
        close = len(draw.calls[0]) == len(want_drawn) and all(abs(a - b) < 1e-9 for a, b in zip(draw.calls[0],
                                                                                                   want_drawn))
        expect(close, given, f"draw given {want_drawn}", f"draw given {draw.calls[0]}")


@acceptance.case
def a_guess_the_target_likes_at_least_as_much_is_always_accepted(impl: Callable) -> None:
    """A guess with p >= q is always accepted, and after k accepted the bonus comes from p[k]."""
    _accept(impl, [1], [[0.2, 0.7, 0.1], [0.5, 0.25, 0.25]], [[0.3, 0.6, 0.1]], [0.999], [1, DRAWN],
            "p(1) = 0.7 >= q(1) = 0.6: accepted; then the bonus", want_drawn=[0.5, 0.25, 0.25])


@acceptance.case
def a_guess_is_accepted_with_probability_p_over_q(impl: Callable) -> None:
    """A guess is accepted with probability p/q: uniform below p/q accepts, at or above rejects."""
    p, q = [[0.1, 0.3, 0.6], [1.0, 0.0, 0.0]], [[0.1, 0.6, 0.3]]
    _accept(impl, [1], p, q, [0.49], [1, DRAWN], "p/q = 0.3/0.6 = 0.5 and 0.49 < 0.5: accepted")
    _accept(impl, [1], p, q, [0.5], [DRAWN], "0.5 is not < 0.5: rejected")


@acceptance.case
def at_the_first_rejection_draw_from_the_normalised_residual(impl: Callable) -> None:
    """At the first rejection: draw from max(0, p - q) normalised, and stop."""
    p, q = [[0.1, 0.3, 0.6], [1.0, 0.0, 0.0]], [[0.1, 0.6, 0.3]]
    _accept(impl, [1], p, q, [0.9], [DRAWN], "rejected; residual max(0, p - q) = [0, 0, 0.3] -> [0, 0, 1]",
            want_drawn=[0.0, 0.0, 1.0])
    p2, q2 = [[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1, 0, 0]], [[0.2, 0.5, 0.3], [0.1, 0.2, 0.7]]
    _accept(impl, [0, 2], p2, q2, [0.0, 0.95], [0, DRAWN],
            "guess 0 accepted (p >= q); guess 2: 0.6/0.7, 0.95 rejects; residual [0.1, 0, 0] -> [1, 0, 0]",
            want_drawn=[1.0, 0.0, 0.0])


@acceptance.case
def later_guesses_are_not_examined_after_a_rejection(impl: Callable) -> None:
    """Nothing after the first rejected guess is kept, even guesses the target would like."""
    p = [[0.9, 0.1], [0.0, 1.0], [0.0, 1.0], [0.5, 0.5]]
    # only the tokens are checked here: what the replacement is drawn from is the residual cases' rule
    _accept(impl, [1, 1, 1], p, None, [0.5, 0.0, 0.0], [DRAWN],
            "the first guess is rejected (0.5 >= 0.1): the two after it, which the target would keep, are not")


@acceptance.case
def a_residual_that_sums_to_zero_falls_back_to_p(impl: Callable) -> None:
    """When rounding leaves the residual summing to 0 (p = q but for rounding), draw the replacement from p[i]."""
    p, q = [[0.3, 0.7], [0.5, 0.5]], [[0.1 + 0.2, 0.7]]  # q(0) = 0.30000000000000004, a hair above p(0)
    _accept(impl, [0], p, q, [1 - 2**-53], [DRAWN],
            "p/q = 0.3 / 0.30000000000000004 is just below 1, so 0.9999999999999999 rejects; max(0, p - q) = [0, 0] "
            "sums to 0: draw from p[0]", want_drawn=[0.3, 0.7])


@acceptance.case
def without_q_the_guess_is_one_hot(impl: Callable) -> None:
    """Without q (n-gram guesses), q is one-hot: accept with probability p(guess); residual p without the guess."""
    p = [[0.25, 0.5, 0.25], [0.2, 0.3, 0.5]]
    _accept(impl, [1], p, None, [0.4], [1, DRAWN], "0.4 < p(1) = 0.5: accepted", want_drawn=[0.2, 0.3, 0.5])
    _accept(impl, [1], p, None, [0.6], [DRAWN], "0.6 >= 0.5: rejected; residual [0.25, 0, 0.25] -> [0.5, 0, 0.5]",
            want_drawn=[0.5, 0.0, 0.5])


@acceptance.case
def the_arguments_are_left_unchanged(impl: Callable) -> None:
    """The argument lists are left as they were."""
    drafted, p, q, u = [1, 0], [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], [[0.2, 0.8], [0.9, 0.1]], [0.3, 0.9]
    copies = ([*drafted], [list(r) for r in p], [list(r) for r in q], [*u])
    call("accept_drafts([1, 0], ...)", "no error", impl, drafted, p, q, u, Draw(0))
    expect((drafted, p, q, u) == copies, "the lists after the call", "unchanged", f"{drafted}, {p}, {q}, {u}")


@acceptance.case
def the_first_token_is_distributed_exactly_as_the_target(impl: Callable) -> None:
    """The first emitted token is distributed exactly as p[0] (summed over every guess and uniform)."""
    rng = random.Random(7)
    for trial in range(6):
        size = rng.choice([2, 3, 4])
        raw_p, raw_q = [rng.random() ** 2 for _ in range(size)], [rng.random() ** 2 for _ in range(size)]
        p0, q0 = [x / sum(raw_p) for x in raw_p], [x / sum(raw_q) for x in raw_q]
        p = [p0, [1.0 / size] * size]
        total = [0.0] * size
        grid = [(j + 0.5) / 400 for j in range(400)]  # the uniform, integrated on a grid
        for guess in range(size):
            for u in grid:
                draw = Draw()
                got = call(f"trial {trial}: accept_drafts([{guess}], p={p}, q={[q0]}, uniforms=[{u}])",
                           "a list of tokens", impl, [guess], p, [q0], [u], draw)
                weight = q0[guess] / len(grid)
                if list(got) and list(got)[0] == guess and len(list(got)) == 2:
                    total[guess] += weight
                elif list(got) == [DRAWN] and draw.calls:
                    total = [t + weight * x for t, x in zip(total, draw.calls[0])]
                else:
                    expect(False, f"trial {trial}: accept_drafts([{guess}], p, q, uniforms=[{u}])",
                           f"[{guess}, <bonus>] or [<drawn>]", repr(got))
        ok = all(abs(a - b) < 5e-3 for a, b in zip(total, p0))
        expect(ok, f"trial {trial}: p[0] = {[round(x, 4) for x in p0]}, q[0] = {[round(x, 4) for x in q0]}",
               f"the first token distributed as p[0] = {[round(x, 4) for x in p0]}",
               f"{[round(x, 4) for x in total]}")


# ---------------------------------------------------------------------------------------------------- ngram


def _ngram(impl: Any, tokens: list[int], k: int, n_max: int, n_min: int, want: list[int], why: str) -> None:
    given = f"propose_ngram({tokens}, k={k}, n_max={n_max}, n_min={n_min})"
    got = call(given, f"{want} ({why})", impl, list(tokens), k, n_max, n_min)
    expect(isinstance(got, list | tuple) and list(got) == want, given, f"{want} ({why})", repr(got))


@ngram.case
def it_proposes_what_followed_the_last_n_tokens(impl: Callable) -> None:
    """It proposes up to k tokens that followed the last n tokens' earlier occurrence."""
    _ngram(impl, [1, 2, 3, 9, 1, 2], 2, 2, 1, [3, 9], "[1, 2] occurred at 0, followed by 3, 9")
    _ngram(impl, [1, 2, 3, 9, 1, 2], 5, 2, 1, [3, 9, 1, 2], "up to k: the tokens end first")


@ngram.case
def a_longer_match_wins(impl: Callable) -> None:
    """Longer n first: a match of n_max beats a more recent shorter one."""
    _ngram(impl, [4, 5, 6, 7, 5, 8, 4, 5], 1, 2, 1, [6], "[4, 5] matched at 0 (-> 6), before [5] at 4 (-> 8)")


@ngram.case
def the_most_recent_match_wins(impl: Callable) -> None:
    """For one n, the most recent earlier match wins."""
    _ngram(impl, [3, 1, 3, 2, 3], 1, 1, 1, [2], "[3] at 2 (-> 2) is more recent than at 0 (-> 1)")


@ngram.case
def a_match_may_overlap_the_suffix(impl: Callable) -> None:
    """A match may overlap the suffix (it only has to start earlier)."""
    _ngram(impl, [7, 7, 7], 3, 2, 2, [7], "[7, 7] at 0 is followed by the last 7")


@ngram.case
def no_match_gives_nothing(impl: Callable) -> None:
    """No match for any n in [n_min, n_max] gives []; an n longer than the tokens allow is skipped."""
    _ngram(impl, [1, 2, 3, 4], 3, 3, 1, [], "4 never occurred before")
    _ngram(impl, [1, 2, 3, 1, 2], 3, 3, 3, [], "n_min = 3: [3, 1, 2] never occurred before")
    _ngram(impl, [5], 3, 4, 1, [], "one token: nothing earlier")
    _ngram(impl, [5, 5], 3, 4, 1, [5], "n_max = 4 is too long for 2 tokens: n = 1 finds the first 5")


@ngram.case
def the_tokens_are_left_unchanged(impl: Callable) -> None:
    """The token list is left as it was."""
    tokens = [1, 2, 1, 2]
    call("propose_ngram([1, 2, 1, 2], 2, 2, 1)", "no error", impl, tokens, 2, 2, 1)
    expect(tokens == [1, 2, 1, 2], "the list after the call", "unchanged", str(tokens))


@ngram.case
def matches_minillms_proposer_on_random_tokens(impl: Callable) -> None:
    """Matches minillm's propose_ngram on 200 random token lists."""
    rng = random.Random(70)
    for trial in range(200):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 25))]
        n_min = rng.randrange(1, 3)
        k, n_max = rng.randrange(1, 6), n_min + rng.randrange(0, 3)
        _ngram(impl, tokens, k, n_max, n_min, propose_ngram(tokens, k, n_max, n_min), f"trial {trial}: minillm's")


# ---------------------------------------------------------------------------------------------------- best_k


def _speedups(alpha: float, draft_cost: float, verify_cost: list[float]) -> list[float]:
    """Tokens per decode step's worth of time for k = 0 .. len(verify_cost) - 1 guesses."""
    tokens = [sum(alpha**i for i in range(k + 1)) for k in range(len(verify_cost))]
    return [t / (verify_cost[k] + k * draft_cost) for k, t in enumerate(tokens)]


def _fastest(speedups: list[float]) -> int:
    best = 0
    for k, s in enumerate(speedups):
        if s > speedups[best]:
            best = k
    return best


def _best_k(impl: Any, alpha: float, draft_cost: float, verify_cost: list[float], why: str, given: str = "") -> None:
    speedups = _speedups(alpha, draft_cost, verify_cost)
    want = _fastest(speedups)
    given = given or f"best_k(alpha={alpha}, draft_cost={draft_cost}, verify_cost={verify_cost})"
    table = ", ".join(f"k={k}: {s:.3f}x" for k, s in enumerate(speedups))
    expected = f"{want} ({why}; speedups {table})"
    got = call(given, expected, impl, alpha, draft_cost, list(verify_cost))
    ok = isinstance(got, int) and not isinstance(got, bool) and got == want
    shown = f"{got!r}" + (f" ({speedups[got]:.3f}x)" if isinstance(got, int) and 0 <= got < len(speedups) else "")
    expect(ok, given, expected, shown)


FLAT = [1.0] * 7  # verification as cheap as a decode step: a memory-bound pass on a GPU at batch 1
CPU = [1.0, 1.18, 1.37, 1.40, 1.39, 1.50, 1.55]  # a pass over 1..7 tokens measured on a 2-core laptop CPU


@best_k.case
def k_is_zero_unless_some_k_is_strictly_faster_than_plain_decoding(impl: Callable) -> None:
    """k = 0 unless some k is strictly faster than plain decoding."""
    _best_k(impl, 0.2, 0.05, CPU, "guesses kept 20% of the time never repay their passes: decode plainly")
    _best_k(impl, 0.0, 0.0, FLAT, "nothing is ever kept: every k only ties with plain decoding, which is no gain")


@best_k.case
def every_guess_costs_a_draft_pass(impl: Callable) -> None:
    """Every guess costs a draft pass: more guesses are not always faster."""
    _best_k(impl, 0.8, 0.2, FLAT, "after k = 4 a guess adds less than its draft pass costs")


@best_k.case
def the_bonus_token_counts(impl: Callable) -> None:
    """A round yields the kept guesses plus the target's own token (the bonus when all are kept)."""
    _best_k(impl, 0.2, 0.05, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3],
            "one guess gives 1 + α tokens a round: a 20% chance of a second token for 1.1 steps pays")


@best_k.case
def a_pass_over_k_plus_1_tokens_costs_verify_cost_k(impl: Callable) -> None:
    """A pass over k + 1 tokens costs verify_cost[k] decode steps, not one."""
    _best_k(impl, 0.76, 0.23, CPU, "this CPU's passes grow dearer with their tokens")
    _best_k(impl, 0.9, 0.0, [1.0, 1.02, 1.05, 1.1, 1.2, 1.4, 1.8], "free guesses, but past 5 tokens a pass gets dear")


@best_k.case
def alpha_one_keeps_every_guess(impl: Callable) -> None:
    """With alpha = 1 every guess is kept: k guesses yield k + 1 tokens."""
    _best_k(impl, 1.0, 0.1, FLAT, "k + 1 tokens for 1 + 0.1 k steps: the most guesses allowed")


@best_k.case
def k_goes_up_to_len_verify_cost_minus_one(impl: Callable) -> None:
    """k may be 0 .. len(verify_cost) - 1, and no more."""
    _best_k(impl, 0.95, 0.05, [1.0, 1.05, 1.1], "verify_cost covers passes over 1..3 tokens: k = 2 at most")


@best_k.case
def verify_cost_is_left_unchanged(impl: Callable) -> None:
    """verify_cost is left as it was."""
    costs = list(CPU)
    call(f"best_k(0.7, 0.2, {CPU})", "no error", impl, 0.7, 0.2, costs)
    expect(costs == CPU, "verify_cost after the call", "unchanged", str(costs))


@best_k.case
def matches_the_fastest_k_on_random_settings(impl: Callable) -> None:
    """Picks the fastest k on 300 random acceptance rates and costs."""
    rng = random.Random(77)
    done = 0
    while done < 300:
        alpha, cost = round(rng.random(), 3), round(rng.random() * 0.5, 3)
        verify = [1.0]
        for _ in range(rng.randrange(1, 8)):
            verify.append(round(verify[-1] + rng.random() * 0.4, 3))
        speedups = sorted(_speedups(alpha, cost, verify), reverse=True)
        if speedups[0] - speedups[1] < 1e-6:  # a near-tie: either k would be right
            continue
        done += 1
        _best_k(impl, alpha, cost, verify, f"trial {done}")
