"""Chapter 11 exercise `ch11.guess_masks`: a verifying request's masks, one per guess prefix, and rollback."""


def guess_masks(matcher, guesses: list[int]) -> list[set[int] | None]:
    """The masks of the k + 1 sampling rows of a request that verifies k guesses in this step.

    matcher: the request's grammar matcher, where the tokens it has kept left it (not finished), with
        matcher.allowed() -> set[int]   the tokens the grammar allows next
        matcher.accept(token) -> bool   advance by `token`; False, and no change, if the grammar refuses it
        matcher.rollback(n)             undo the last n accepted tokens
        matcher.is_finished             True once the grammar is complete (its end-of-sequence token accepted)
    guesses: the k guessed token ids, in order.
    Row j (j = 0 .. k) samples the token after guesses[:j]: its mask is what the grammar allows after those
    j guesses. Return k + 1 entries, entry j the set of tokens allowed after guesses[:j] — or None where no
    mask applies: every row after a guess the grammar refuses (the acceptance rule stops at that guess
    anyway: its own row's mask gives it no chance), and every row after a guess that finishes the grammar.
    Entry 0 is always a set: the matcher as it is.
    Leave the matcher exactly where it was: the guesses are not the request's yet — the engine advances the
    matcher later with the tokens the acceptance rule keeps. Roll back exactly the guesses it accepted:
    rolling back more would undo tokens the request has really kept.
    Example: the grammar `(no|nay)!`, the vocabulary ["<eos>", "n", "o", "a", "y", "!", "x", "no", "ay",
    "y!", "e"] (ids 0-10), nothing kept yet; guesses [1, 3, 6] (n, a, x) -> [{1, 7}, {2, 3, 8}, {4, 9},
    None]: n or no first; after n, o or a or ay; after na, y or y!; 'x' is refused, so the row after it
    has no mask; and the matcher is back at the start.
    """
    raise NotImplementedError("ch11.guess_masks: accept each guess, fill its row, then roll back what was accepted")
