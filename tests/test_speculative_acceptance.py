"""The acceptance rule (minillm/speculative/acceptance.py) and the n-gram proposer
(minillm/speculative/ngram.py), as pure functions: exact outcomes on hand-made distributions, and
the target's distribution preserved, checked statistically with fixed seeds."""

import pytest
import torch

from minillm.speculative import accept_greedy, accept_sampled, propose_ngram


def test_greedy_keeps_guesses_while_they_equal_the_argmax_then_the_targets_token():
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted, plus the bonus
    assert accept_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # the second guess is wrong: the target's instead
    assert accept_greedy([5, 6, 7], [1, 6, 7, 8]) == [1]  # nothing accepted: still one token per pass
    assert accept_greedy([], [4]) == [4]
    with pytest.raises(ValueError, match="need 3 target tokens"):
        accept_greedy([1, 2], [1, 2])


def frequencies(draws: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(draws), minlength=vocab).double() / len(draws)


def test_hand_made_distributions_give_their_exact_outcome_probabilities():
    """p = [.5, .3, .2], q = [.2, .6, .2]. Guess 1: accepted with p/q = 0.5, and a rejection resamples
    from max(0, p - q) = [.3, 0, 0], i.e. always token 0. Guess 0: p/q > 1, always accepted."""
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = torch.tensor([[0.2, 0.6, 0.2]])
    gen = torch.Generator().manual_seed(0)
    outcomes = [tuple(accept_sampled([1], p, q, gen)) for _ in range(20_000)]
    accepted = sum(o[0] == 1 for o in outcomes) / len(outcomes)
    assert accepted == pytest.approx(0.5, abs=0.02)  # 5.7 standard deviations of a binomial mean
    assert all(o == (0,) for o in outcomes if o[0] != 1)  # every rejection resampled token 0, and stopped
    assert all(len(o) == 2 for o in outcomes if o[0] == 1)  # every acceptance drew a bonus from p[1]
    bonus = frequencies([o[1] for o in outcomes if o[0] == 1], 3)
    assert torch.allclose(bonus, p[1].double(), atol=0.02)
    assert all(accept_sampled([0], p, q, gen)[0] == 0 for _ in range(500))  # p/q = 2.5: never rejected


def test_a_one_hot_proposal_is_accepted_with_the_targets_probability_and_never_resampled():
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    gen = torch.Generator().manual_seed(1)
    firsts = [accept_sampled([1], p, None, gen)[0] for _ in range(20_000)]
    assert frequencies(firsts, 2)[1] == pytest.approx(0.75, abs=0.02)  # accepted 3/4, else the other token
    assert all(accept_sampled([0], torch.tensor([[0.0, 1.0], [1.0, 0.0]]), None, gen) == [1] for _ in range(100))


def test_seeded_draws_are_reproducible():
    p, q = torch.softmax(torch.randn(4, 6), -1), torch.softmax(torch.randn(3, 6), -1)
    runs = [[accept_sampled([2, 3, 4], p, q, torch.Generator().manual_seed(7)) for _ in range(3)] for _ in range(2)]
    assert runs[0] == runs[1]


def draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


# A tiny "language model" with a vocabulary of 6: the next token's distribution depends on the previous
# token only. The draft is a different (worse) model of the same kind.
VOCAB = 6
TARGET = torch.softmax(2 * torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(2)), dim=-1)
DRAFT = torch.softmax(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(3)), dim=-1)


def speculate_two_tokens(context: int, k: int, gen: torch.Generator, one_hot: bool) -> tuple[int, int]:
    """Generate two tokens after `context` by speculation (k drafted per pass), as an engine would."""
    out: list[int] = []
    last = context
    while len(out) < 2:
        drafted, q_rows, prev = [], [], last
        for _ in range(k):
            q = DRAFT[prev]
            token = int(q.argmax()) if one_hot else draw(q, gen)  # one-hot: a deterministic guesser
            drafted.append(token)
            q_rows.append(q)
            prev = token
        p_rows = torch.stack([TARGET[t] for t in [last, *drafted]])  # (k + 1, vocab)
        out += accept_sampled(drafted, p_rows, None if one_hot else torch.stack(q_rows), gen)
        last = out[-1]
    return out[0], out[1]


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-model", "deterministic-guesser"])
@pytest.mark.parametrize("k", [1, 3])
def test_speculation_preserves_the_targets_one_and_two_token_distributions(k, one_hot):
    """20,000 two-token continuations of context 0. Threshold: total variation 0.03 on the 36 two-token
    outcomes (the sampling noise alone gives about 0.01 here; a rule that skipped the p/q test or
    resampled from p instead of max(0, p - q) gives 0.1 or more)."""
    gen = torch.Generator().manual_seed(10 * k + one_hot)
    pairs = [speculate_two_tokens(0, k, gen, one_hot) for _ in range(20_000)]
    firsts = frequencies([a for a, _ in pairs], VOCAB)
    joint = frequencies([a * VOCAB + b for a, b in pairs], VOCAB * VOCAB)
    exact_joint = (TARGET[0][:, None] * TARGET).reshape(-1).double()  # P(a) * P(b | a)
    assert total_variation(firsts, TARGET[0].double()) < 0.02
    assert total_variation(joint, exact_joint) < 0.03


def test_the_statistical_check_catches_a_wrong_rule(monkeypatch):
    """The same check on a broken rule (every guess accepted) must fail: the threshold has teeth."""
    gen = torch.Generator().manual_seed(5)
    broken = lambda drafted, p, q=None, g=None: list(drafted) + [draw(p[len(drafted)], g)]  # noqa: E731
    monkeypatch.setitem(globals(), "accept_sampled", broken)
    pairs = [speculate_two_tokens(0, 3, gen, one_hot=False) for _ in range(20_000)]
    joint = frequencies([a * VOCAB + b for a, b in pairs], VOCAB * VOCAB)
    assert total_variation(joint, (TARGET[0][:, None] * TARGET).reshape(-1).double()) > 0.1


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="target_probs must be"):
        accept_sampled([1, 2], torch.rand(2, 4))
    with pytest.raises(ValueError, match="draft_probs must be"):
        accept_sampled([1, 2], torch.rand(3, 4), torch.rand(2, 5))


def test_ngram_lookup_proposes_what_followed_the_last_tokens_before():
    text = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    assert propose_ngram(text, k=2) == [4, 5]  # the last 3 tokens, 1 2 3, were followed by 4 5
    assert propose_ngram(text, k=10) == [4, 5, 9, 9, 1, 2, 3]  # stops at the end of the tokens
    assert propose_ngram([7, 1, 2, 8, 2], k=2) == [8, 2]  # only "2" repeats: 8 2 followed it
    assert propose_ngram([4, 5, 6], k=3) == []  # nothing repeats
    assert propose_ngram([3, 3, 3], k=2) == [3]  # an overlapping match: "3 3" at 0 was followed by a 3
    assert propose_ngram([1, 2, 5, 1, 2, 6, 1, 2], k=1) == [6]  # the most recent earlier match wins
    with pytest.raises(ValueError, match="k >= 1"):
        propose_ngram([1, 2], k=0)
