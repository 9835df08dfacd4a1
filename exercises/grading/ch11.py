"""Chapter 11's cases: `ch11.token_mask` (the tokens a regex automaton allows next, packed as the engine's
bitmask row), `ch11.guess_masks` (a verifying request's masks, one per guess prefix, and the rollback that
leaves its matcher where it was) and `ch11.fill_threads` (how many threads fill a step's masks beside its
forward pass)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from exercises.grading.core import RUN_MEMO, call, exercise, expect, fail

token_mask = exercise("ch11.token_mask", "ch11_token_mask", "token_mask")
guess_masks = exercise("ch11.guess_masks", "ch11_guess_masks", "guess_masks", time_limit_s=30.0)
fill_threads = exercise("ch11.fill_threads", "ch11_fill_threads", "fill_threads")

# ----------------------------------------------------------------------------------------- automata

# (no|nay)! with a dead end after "ne": the notebook's example
NO_NAY = {0: {"n": 1}, 1: {"o": 2, "a": 3, "e": 5}, 3: {"y": 2}, 2: {"!": 4}, 5: {"e": 5}}
NO_NAY_ACCEPTING = {4}
NO_NAY_VOCAB = ["<eos>", "n", "no", "nay", "na", "y", "!", "no!", "o", "ne", ""]

# (ROMEO|JULIET): [a-z ]+\. in small: (RO|JU): [ab]+\.
LETTERS = "ab "
SPEAKER = {0: {"R": 1, "J": 2}, 1: {"O": 3}, 2: {"U": 3}, 3: {":": 4}, 4: {" ": 5},
           5: dict.fromkeys(LETTERS, 6), 6: {**dict.fromkeys(LETTERS, 6), ".": 7}, 7: {}}
SPEAKER_ACCEPTING = {7}
SPEAKER_VOCAB = ["<|end|>", "R", "RO", "ROM", "J", "JU", "JUL", ":", ": ", ":\n", " ", " a", " ab", "ab", "b",
                 "a.", ".", ".\n", "O", "O:", "O: a", "U: ", "<", "RO: ab.", "ba b"]


def live_states(transitions: dict[int, dict[str, int]], accepting: set[int]) -> set[int]:
    live, changed = set(accepting), True
    while changed:
        changed = False
        for state, moves in transitions.items():
            if state not in live and any(t in live for t in moves.values()):
                live.add(state)
                changed = True
    return live


def allowed_tokens(transitions, accepting, state, vocab, eos_token_id) -> list[int]:
    """The reference: which tokens are allowed (unpacked)."""
    live = live_states(transitions, accepting)
    allowed = []
    for token, text in enumerate(vocab):
        if token == eos_token_id:
            ok = state in accepting
        else:
            at = state if text else None
            for character in text:
                at = transitions.get(at, {}).get(character)
                if at is None:
                    break
            ok = at is not None and at in live
        if ok:
            allowed.append(token)
    return allowed


def pack(tokens: Sequence[int], vocab_size: int) -> list[int]:
    words = [0] * ((vocab_size + 31) // 32)
    for t in tokens:
        words[t // 32] |= 1 << (t % 32)
    return words


def unpacked(words: Any, vocab_size: int) -> list[int] | None:
    """The tokens a packed mask allows, or None when it is not a list of unsigned 32-bit words."""
    if not isinstance(words, list | tuple) or not all(isinstance(w, int) and 0 <= w < 2**32 for w in words):
        return None
    return [t for t in range(min(vocab_size, 32 * len(words))) if words[t // 32] >> (t % 32) & 1]


def _shown(tokens: Sequence[int], vocab: Sequence[str]) -> str:
    return "[" + ", ".join(f"{t}:{vocab[t]!r}" for t in tokens) + "]"


def _mask(impl: Callable, name: str, transitions, accepting, state, vocab, eos: int, why: str) -> None:
    given = f"token_mask(<{name}>, accepting={sorted(accepting)}, state={state}, vocab={vocab}, eos_token_id={eos})"
    want = allowed_tokens(transitions, accepting, state, vocab, eos)
    expected = f"{pack(want, len(vocab))}: allowed {_shown(want, vocab)} ({why})"
    got = call(given, expected, impl, {s: dict(m) for s, m in transitions.items()}, set(accepting), state,
               list(vocab), eos)
    tokens = unpacked(got, len(vocab))
    words = (len(vocab) + 31) // 32
    if tokens is None or len(got) != words:
        fail(given, expected + f" — {words} unsigned 32-bit words", repr(got))
    if tokens != want:
        fail(given, expected, f"{list(got)}: allowed {_shown(tokens, vocab)}")
    expect(list(got) == pack(want, len(vocab)), given, expected + " with no bits past the vocabulary", repr(got))


@token_mask.case
def token_mask_example(impl: Callable) -> None:
    """The notebook's example: (no|nay)! from its start, 1, 2, 3, 4 and 7 allowed -> [158]"""
    _mask(impl, "(no|nay)! with a dead end after 'ne'", NO_NAY, NO_NAY_ACCEPTING, 0, NO_NAY_VOCAB, 0,
          "the example of the contract")


@token_mask.case
def every_character_of_a_token_is_walked(impl: Callable) -> None:
    """Every character of a token is walked: a token whose first character fits but a later one does not is refused"""
    _mask(impl, "(RO|JU): [ab ]+\\.", SPEAKER, SPEAKER_ACCEPTING, 0, SPEAKER_VOCAB, 0,
          "'ROM' and 'JUL' start well and fall off at 'M' and 'L'")
    _mask(impl, "(RO|JU): [ab ]+\\.", SPEAKER, SPEAKER_ACCEPTING, 3, SPEAKER_VOCAB, 0,
          "after the name: ':' and ': ' fit, ':\\n' falls off at the line break")


@token_mask.case
def a_token_may_cross_from_one_part_of_the_pattern_into_the_next(impl: Callable) -> None:
    """A token may cross several states at once: from the name into the colon, the space and the words"""
    _mask(impl, "(RO|JU): [ab ]+\\.", SPEAKER, SPEAKER_ACCEPTING, 1, SPEAKER_VOCAB, 0,
          "after 'R': 'O', 'O:' and 'O: a' all fit")
    _mask(impl, "(RO|JU): [ab ]+\\.", SPEAKER, SPEAKER_ACCEPTING, 6, SPEAKER_VOCAB, 0,
          "inside the words: letters, spaces, and tokens ending in the final '.'")


@token_mask.case
def a_token_that_leads_into_a_dead_end_is_refused(impl: Callable) -> None:
    """A token that ends in a dead end (no accepting state reachable from it) is refused"""
    _mask(impl, "(no|nay)! with a dead end after 'ne'", NO_NAY, NO_NAY_ACCEPTING, 1, NO_NAY_VOCAB, 0,
          "after 'n': 'e' would walk into state 5, from which no accepting state can be reached")
    trap = {0: {"a": 1, "b": 2}, 1: {"a": 1}, 2: {"c": 3}, 3: {}}
    _mask(impl, "a trap: a+ never ends, bc does", trap, {3}, 0, ["a", "aa", "b", "bc", "c", "<eos>"], 5,
          "state 1 (a, aa) has moves but no way to an accepting state")


@token_mask.case
def the_end_of_sequence_token_only_where_the_text_is_complete(impl: Callable) -> None:
    """The end-of-sequence token is allowed exactly in accepting states, and its text is never walked"""
    _mask(impl, "(RO|JU): [ab ]+\\.", SPEAKER, SPEAKER_ACCEPTING, 7, SPEAKER_VOCAB, 0,
          "the text is complete: only the end-of-sequence token")
    loop = {0: {"a": 1}, 1: {"a": 1, "b": 1}}
    _mask(impl, "a[ab]*", loop, {1}, 1, ["a", "b", "ab", "<eos>", "c"], 3,
          "accepting and able to go on: the end, and every continuation")
    _mask(impl, "(no|nay)! whose end token's text is 'n'", NO_NAY, NO_NAY_ACCEPTING, 0,
          ["n", "no", "nay", "x", "!"], 0, "token 0 ends the sequence: its text 'n' is not read, and state 0 "
          "is not accepting")


@token_mask.case
def a_token_without_text_is_never_allowed(impl: Callable) -> None:
    """A token with no text is never allowed (it would not move the automaton)"""
    _mask(impl, "(no|nay)!", NO_NAY, NO_NAY_ACCEPTING, 2, ["", "!", "<eos>", ""], 2, "'' stays in state 2: refused")


@token_mask.case
def the_bits_are_packed_as_the_engines_bitmask(impl: Callable) -> None:
    """The bits are packed as the engine's bitmask: token t is bit t % 32 of word t // 32, unsigned words"""
    vocab = [f"x{i}" for i in range(70)]
    chosen = [0, 5, 31, 32, 63, 64, 69]
    for t in chosen:
        vocab[t] = "a"
    one = {0: {"a": 1}, 1: {}}
    _mask(impl, "a", one, {1}, 0, vocab, 1, "3 words; tokens 31 and 63 are the top bits of their words")


@token_mask.case
def random_automata(impl: Callable) -> None:
    """Random automata and vocabularies: the mask as the rules give it"""
    rng = random.Random(11)
    for case in range(30):
        states = rng.randint(2, 7)
        alphabet = "abc"
        transitions = {s: {c: rng.randrange(states) for c in alphabet if rng.random() < 0.5} for s in range(states)}
        accepting = {s for s in range(states) if rng.random() < 0.3} or {states - 1}
        vocab = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(5, 80))]
        eos = rng.randrange(len(vocab))
        _mask(impl, f"random automaton {case}: {transitions}", transitions, accepting, rng.randrange(states), vocab,
              eos, "as the rules give it")


# -------------------------------------------------------------------------------------- guess masks

class CountingMatcher:
    """A matcher over an automaton, one token per string of characters; it keeps its history, so that a
    rollback past the guesses shows (it undoes a token the request had really kept)."""

    def __init__(self, transitions, accepting, vocab: Sequence[str], eos: int, kept: Sequence[int] = ()):
        self.transitions, self.accepting, self.vocab, self.eos = transitions, set(accepting), list(vocab), eos
        self.history: list[int] = []  # accepted tokens, the request's kept ones first
        self.states = [0]
        self.finished = False
        self.calls: list[str] = []
        for token in kept:
            assert self.accept(token), token
        self.calls.clear()

    def _after(self, state: int, token: int) -> int | None:
        if token == self.eos:
            return state if state in self.accepting else None
        return walk(self.transitions, state, self.vocab[token])

    def allowed(self) -> set[int]:
        self.calls.append("allowed()")
        if self.finished:
            return set()
        return set(allowed_tokens(self.transitions, self.accepting, self.states[-1], self.vocab, self.eos))

    def accept(self, token: int) -> bool:
        self.calls.append(f"accept({token})")
        if self.finished:
            return False
        after = self._after(self.states[-1], token)
        if after is None or after not in live_states(self.transitions, self.accepting):
            return False
        self.history.append(token)
        self.states.append(after)
        self.finished = token == self.eos
        return True

    def rollback(self, n: int) -> None:
        self.calls.append(f"rollback({n})")
        if not isinstance(n, int) or n < 0 or n > len(self.history):
            raise ValueError(f"cannot roll back {n!r} tokens: the matcher has accepted {len(self.history)}")
        for _ in range(n):
            token = self.history.pop()
            self.states.pop()
            if token == self.eos:
                self.finished = False

    @property
    def is_finished(self) -> bool:
        return self.finished


def walk(transitions, state, text) -> int | None:
    if not text:
        return None
    for character in text:
        state = transitions.get(state, {}).get(character)
        if state is None:
            return None
    return state


def reference_masks(matcher: CountingMatcher, guesses: Sequence[int]) -> list[set[int] | None]:
    masks = [matcher.allowed()]
    accepted = 0
    for guess in guesses:
        if not matcher.accept(guess):
            break
        accepted += 1
        if matcher.is_finished:
            break
        masks.append(matcher.allowed())
    matcher.rollback(accepted)
    return masks + [None] * (len(guesses) + 1 - len(masks))


# one token per character, and a few longer ones
NAY_VOCAB = ["<eos>", "n", "o", "a", "y", "!", "x", "no", "ay", "y!", "e"]


def _named(tokens: Sequence[int] | set[int] | None, vocab: Sequence[str]) -> str:
    if tokens is None:
        return "None"
    return "{" + ", ".join(repr(vocab[t]) for t in sorted(tokens)) + "}"


def _guess(impl: Callable, guesses: Sequence[int], why: str, kept: Sequence[int] = (),
           transitions=NO_NAY, accepting=frozenset(NO_NAY_ACCEPTING), vocab: Sequence[str] = NAY_VOCAB,
           eos: int = 0) -> None:
    matcher = CountingMatcher(transitions, accepting, vocab, eos, kept)
    reference = CountingMatcher(transitions, accepting, vocab, eos, kept)
    want = reference_masks(reference, guesses)
    kept_text = "".join(vocab[t] for t in kept)
    given = (f"guess_masks(<matcher after {kept_text!r}>, guesses={[vocab[g] for g in guesses]}) on "
             "(no|nay)! with a dead end after 'ne'" if transitions is NO_NAY else
             f"guess_masks(<matcher after {kept_text!r}>, guesses={[vocab[g] for g in guesses]})")
    shown = "[" + ", ".join(_named(m, vocab) for m in want) + "]"
    got = call(given, f"{shown} ({why})", impl, matcher, list(guesses))
    ok = isinstance(got, list | tuple) and len(got) == len(want) and all(
        (g is None and w is None) or (g is not None and w is not None and set(g) == w) for g, w in zip(got, want))
    got_shown = ("[" + ", ".join(_named(None if g is None else set(g), vocab) for g in got) + "]"
                 if isinstance(got, list | tuple) and all(g is None or isinstance(g, set | frozenset | list | tuple)
                                                          for g in got) else repr(got))
    expect(ok, given, f"{shown} ({why})", got_shown)
    expect(matcher.history == list(kept), f"after {given}",
           f"the matcher where it was, having accepted {[vocab[t] for t in kept]} (calls: {'; '.join(matcher.calls)})",
           f"it has accepted {[vocab[t] for t in matcher.history]}")


T = {text: t for t, text in enumerate(NAY_VOCAB)}


@guess_masks.case
def guess_masks_example(impl: Callable) -> None:
    """The notebook's example: guesses n, a, x -> [{n, no}, {o, a, ay}, {y, y!}, None]"""
    _guess(impl, [T["n"], T["a"], T["x"]], "'x' is refused after 'na'")


@guess_masks.case
def each_row_is_masked_after_the_guesses_before_it(impl: Callable) -> None:
    """Each row is masked after the guesses before it (the matcher accepts them one by one)"""
    _guess(impl, [T["n"], T["o"], T["!"]], "all three fit: every row after its prefix; '!' completes the text, the "
           "end-of-sequence token comes next", kept=[])
    _guess(impl, [T["a"], T["y"]], "after the kept 'n', the rows follow 'a' and 'y'", kept=[T["n"]])
    _guess(impl, [T["ay"], T["!"]], "a guess of two characters moves two states", kept=[T["n"]])


@guess_masks.case
def a_refused_guess_leaves_the_rows_after_it_unmasked(impl: Callable) -> None:
    """The rows after a guess the grammar refuses carry no mask (None), and the guesses after it are not tried"""
    _guess(impl, [T["x"], T["o"], T["!"]], "the first guess is refused: its row is masked, none after it",
           kept=[T["n"]])
    _guess(impl, [T["o"], T["a"], T["y"]], "'a' after 'no' is refused; 'y' after it is never looked at", kept=[T["n"]])
    _guess(impl, [T["e"], T["e"]], "'e' leads into a dead end: the grammar refuses it", kept=[T["n"]])


@guess_masks.case
def a_guess_that_finishes_the_grammar_ends_the_masks(impl: Callable) -> None:
    """After a guess that finishes the grammar (its end-of-sequence token), the rows carry no mask"""
    _guess(impl, [T["!"], T["<eos>"], T["n"]], "'!' completes the text, the end-of-sequence token finishes it",
           kept=[T["n"], T["o"]])


@guess_masks.case
def the_matcher_is_left_where_it_was(impl: Callable) -> None:
    """The matcher is left where it was: exactly the accepted guesses are rolled back, never a kept token"""
    _guess(impl, [T["y"], T["x"]], "one guess accepted ('y'), so one rolled back: 'n' and 'a' were kept",
           kept=[T["n"], T["a"]])
    _guess(impl, [T["a"], T["x"], T["x"]], "one guess accepted, so one rolled back", kept=[T["n"]])
    _guess(impl, [T["o"]], "no guess accepted: nothing to roll back, the kept 'n', 'a' stay",
           kept=[T["n"], T["a"]])
    _guess(impl, [T["ay"], T["!"], T["<eos>"]], "every guess accepted: all rolled back", kept=[T["n"]])


@guess_masks.case
def no_guesses_one_row(impl: Callable) -> None:
    """No guesses: one row, the matcher as it is"""
    _guess(impl, [], "a plain decode step", kept=[T["n"]])


@guess_masks.case
def random_guesses(impl: Callable) -> None:
    """Random kept tokens and guesses: the masks and the matcher as the rules give them"""
    rng = random.Random(5)
    for _ in range(40):
        kept: list[int] = []
        probe = CountingMatcher(NO_NAY, NO_NAY_ACCEPTING, NAY_VOCAB, 0)
        for _ in range(rng.randint(0, 3)):
            options = sorted(probe.allowed() - {0})
            if not options:
                break
            token = rng.choice(options)
            probe.accept(token)
            kept.append(token)
        guesses = [rng.randrange(len(NAY_VOCAB)) if rng.random() < 0.3 else rng.choice(sorted(probe.allowed()) or [0])
                   for _ in range(rng.randint(0, 4))]
        _guess(impl, guesses, "as the rules give it", kept=kept)


class _LibraryMatcher:
    """minillm's Matcher (xgrammar) behind the exercise's interface."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size

    def allowed(self) -> set[int]:
        from minillm.structured.grammars import allocate_bitmask

        bitmask = allocate_bitmask(1, self.vocab_size)
        self.matcher.fill(bitmask, 0)
        return _bits(bitmask[0], self.vocab_size)

    def accept(self, token: int) -> bool:
        return self.matcher.accept(token)

    def rollback(self, n: int) -> None:
        self.matcher.rollback(n)

    @property
    def is_finished(self) -> bool:
        return self.matcher.is_finished


def _bits(row, vocab_size: int) -> set[int]:
    import torch

    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(bits.flatten()[:vocab_size].nonzero().flatten().tolist())


def _shipped_grammar():
    """The shipped tokenizer and a compiled regex (once per grading run)."""
    if "ch11.shipped" not in RUN_MEMO:
        import minillm
        from minillm.structured import StructuredOutput
        from minillm.structured.grammars import GrammarCompiler

        tokenizer = minillm.load_tokenizer()
        compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
        grammar = compiler.compile(StructuredOutput(regex=r"(ROMEO|JULIET): [a-z ]+\."))
        compiler.close()
        RUN_MEMO["ch11.shipped"] = tokenizer, grammar
    return RUN_MEMO["ch11.shipped"]


@guess_masks.case
def it_agrees_with_the_engine_on_a_real_grammar(impl: Callable) -> None:
    """On the shipped tokenizer and a real grammar, the masks are the engine's (minillm/structured/step_masks.py)"""
    from minillm.structured.grammars import Matcher
    from minillm.structured.step_masks import StepMasks

    tokenizer, grammar = _shipped_grammar()
    vocab_size = len(tokenizer)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    for kept_text, guess_text in (("ROM", "EO: the"), ("JULIET:", " the king."), ("ROMEO: the", " King")):
        kept, guesses = encode(kept_text), encode(guess_text)
        engine_matcher, theirs = Matcher(grammar), Matcher(grammar)
        for token in kept:
            engine_matcher.accept(token)
            theirs.accept(token)
        masks = StepMasks(len(guesses) + 1, vocab_size)
        masks.fill(0, engine_matcher, guesses)
        want = [_bits(masks.bitmask[j], vocab_size) if j in masks.rows else None for j in range(len(guesses) + 1)]
        given = (f"guess_masks(<the shipped tokenizer's matcher after {kept_text!r}>, guesses = the tokens of "
                 f"{guess_text!r})")
        counts = lambda masks_: [None if m is None else len(m) for m in masks_]  # noqa: E731
        got = call(given, f"rows allowing {counts(want)} tokens", impl, _LibraryMatcher(theirs, vocab_size), guesses)
        ok = isinstance(got, list | tuple) and len(got) == len(want) and all(
            (g is None and w is None) or (g is not None and w is not None and set(g) == w) for g, w in zip(got, want))
        expect(ok, given, f"rows allowing {counts(want)} tokens, as StepMasks fills them",
               repr([None if g is None else len(g) for g in got]) if isinstance(got, list | tuple) else repr(got))
        expect(theirs.jump_forward() == engine_matcher.jump_forward() and theirs.accept(encode(":")[0]) ==
               engine_matcher.accept(encode(":")[0]), f"after {given}", "the matcher where it was", "it moved")


# -------------------------------------------------------------------------------------- fill threads

def _threads(fill_ms_per_row, fixed_ms, batch, forward_ms, handoff_ms, max_threads) -> tuple[int, list[float]]:
    waits = []
    for threads in range(1, max_threads + 1):
        filling = fixed_ms + math.ceil(batch / threads) * fill_ms_per_row + (threads * handoff_ms if threads > 1
                                                                              else 0.0)
        waits.append(max(0.0, filling - forward_ms))
    least = min(waits)
    best = next(i for i, w in enumerate(waits) if w <= least + 1e-9)
    return best + 1, waits


def _ask(impl: Callable, why: str, fill_ms_per_row: float, fixed_ms: float, batch: int, forward_ms: float,
         handoff_ms: float, max_threads: int) -> None:
    given = (f"fill_threads(fill_ms_per_row={fill_ms_per_row}, fixed_ms={fixed_ms}, batch={batch}, "
             f"forward_ms={forward_ms}, handoff_ms={handoff_ms}, max_threads={max_threads})")
    want, waits = _threads(fill_ms_per_row, fixed_ms, batch, forward_ms, handoff_ms, max_threads)
    shown = ", ".join(f"T={t}: {w:.3f}" for t, w in enumerate(waits[:8], start=1)) + (" …" if len(waits) > 8 else "")
    expected = f"{want} ({why}; waits in ms: {shown})"
    got = call(given, expected, impl, fill_ms_per_row, fixed_ms, batch, forward_ms, handoff_ms, max_threads)
    expect(isinstance(got, int) and not isinstance(got, bool) and got == want, given, expected, repr(got))


@fill_threads.case
def fill_threads_example(impl: Callable) -> None:
    """The notebook's example: 512 rows beside a 1 ms forward need 3 threads"""
    _ask(impl, "the fewest threads with no wait", 0.005, 0.05, 512, 1.0, 0.03, 8)


@fill_threads.case
def one_thread_when_the_masks_fit_beside_the_forward(impl: Callable) -> None:
    """One thread when the engine's own thread fills the masks within the forward pass"""
    _ask(impl, "16 rows take 0.13 ms of a 5 ms forward", 0.005, 0.05, 16, 5.0, 0.03, 8)
    _ask(impl, "nothing to gain from threads", 0.004, 0.02, 1, 0.01, 0.03, 4)


@fill_threads.case
def the_engines_own_thread_costs_no_handoff(impl: Callable) -> None:
    """The engine's own thread (T = 1) costs no handoff; each thread of a pool does"""
    _ask(impl, "alone: 0.08 ms; two pool threads: 0.04 + 2 x 0.03 = 0.10 ms", 0.01, 0.0, 8, 0.0, 0.03, 4)
    _ask(impl, "alone 0.5 ms; 2 threads 0.25 + 0.2", 0.01, 0.0, 50, 0.0, 0.1, 4)


@fill_threads.case
def more_threads_are_not_always_better(impl: Callable) -> None:
    """More threads are not always better: when none hides the fill, the least wait may need fewer (handoffs cost)"""
    _ask(impl, "the fill cannot hide; past 7 threads a handoff costs more than the rows it takes", 0.01, 0.1, 256,
         0.2, 0.05, 16)
    _ask(impl, "a costly handoff: 2 threads are best", 0.01, 0.0, 40, 0.0, 0.08, 8)


@fill_threads.case
def rows_are_shared_in_whole_rows(impl: Callable) -> None:
    """Rows are whole: with T threads the busiest fills ceil(batch / T) rows"""
    _ask(impl, "10 rows on 3 threads: the busiest fills 4 (0.4 ms > 0.35); on 4 threads 3 (0.3 ms)", 0.1, 0.0, 10,
         0.35, 0.0, 5)
    _ask(impl, "7 rows on 2 threads: the busiest fills 4, 0.40 + 0.02 ms > 0.41; 3 threads fit", 0.1, 0.0, 7, 0.41,
         0.01, 4)


@fill_threads.case
def among_equal_waits_the_fewest_threads(impl: Callable) -> None:
    """Among equal waits the fewest threads: a thread that changes nothing is not worth starting"""
    _ask(impl, "9 rows: 3 and 4 threads both fill 3 rows (0.3 ms) — no wait either way", 0.1, 0.0, 9, 0.3, 0.0, 4)
    _ask(impl, "free handoffs, 10 rows: 5 threads fill 2 rows each as 9 do", 0.1, 0.0, 10, 0.0, 0.0, 9)


@fill_threads.case
def random_servers(impl: Callable) -> None:
    """Random servers: the thread count with the least wait, as the rule gives it"""
    rng = random.Random(3)
    for _ in range(40):
        _ask(impl, "as the rule gives it", round(rng.uniform(0.001, 0.05), 4), round(rng.uniform(0, 0.2), 3),
             rng.choice([1, 8, 16, 64, 256, 512, 1024]), round(rng.uniform(0, 10), 2), round(rng.uniform(0, 0.2), 3),
             rng.randint(1, 16))
