"""Chapter 11 exercise `ch11.token_mask`: the tokens a regex automaton allows next, as the engine's bitmask."""


def token_mask(transitions: dict[int, dict[str, int]], accepting: set[int], state: int, vocab: list[str],
               eos_token_id: int) -> list[int]:
    """The mask of the tokens allowed next from `state`, packed as one row of the engine's bitmask.

    transitions: transitions[s][c] is the state after reading character c in state s; a character with
                 no entry (or a state with no entry at all) leads nowhere: the text can no longer match.
    accepting:   the states in which the text read so far is complete.
    vocab:       vocab[t] is token t's text: one or more characters ("" for a token with no text).
    Token t is allowed iff both:
      * t is not eos_token_id, its text is not empty, and reading its characters one by one from `state`
        never meets a missing entry (every character counts, not just the first);
      * the state it ends in is live: some accepting state (maybe that state itself) can still be
        reached from it — a token that leads into a dead end would leave the output unfinishable.
    eos_token_id (the end-of-sequence token) is allowed iff `state` is accepting; its text in `vocab` is
    never read as characters.
    Return ceil(len(vocab) / 32) words: token t is bit t % 32 (the least significant bit first) of word
    t // 32, 1 when allowed; each word an unsigned integer, 0 <= word < 2**32; bits past the last token 0.
    Example: the automaton of `(no|nay)!` — 0 -n-> 1, 1 -o-> 2, 1 -a-> 3, 3 -y-> 2, 2 -!-> 4, accepting
    {4} — with a dead end 1 -e-> 5, 5 -e-> 5, and vocab ["<eos>", "n", "no", "nay", "na", "y", "!", "no!",
    "o", "ne", ""], eos 0: from state 0 the tokens 1, 2, 3, 4 and 7 are allowed -> [158].
    Do not modify the arguments. Errors: none to raise.
    """
    raise NotImplementedError("ch11.token_mask: walk every token's characters from the state, pack the bits")
