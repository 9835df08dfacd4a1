"""ch11's graders: FAIL lines name the broken rule and show what was asked, expected and got; the reference
mask of `ch11.token_mask` is the grammar library's on the shipped vocabulary; the grader's matcher catches
a rollback that undoes a kept token."""

from __future__ import annotations

import pytest
import torch

from exercises.grading import run
from exercises.grading.ch11 import NAY_VOCAB, NO_NAY, NO_NAY_ACCEPTING, CountingMatcher, pack, unpacked
from solutions.ch11_token_mask import token_mask
from tests.exercises.wrong_answers import (
    guess_masks_roll_back_every_guess,
    token_mask_first_character_only,
    token_mask_signed_words,
)


def _failed(name, impl) -> list[str]:
    return [r.line() for r in run(name, impl) if not r.passed]


def test_a_first_character_walk_is_reported_with_the_tokens_it_let_through():
    failures = _failed("ch11.token_mask", token_mask_first_character_only)
    walked = next(line for line in failures if "Every character of a token is walked" in line)
    assert "state=0" in walked and "expected [" in walked and "'ROM'" in walked and ", got [" in walked


def test_signed_words_fail_only_where_a_top_bit_is_set():
    failures = _failed("ch11.token_mask", token_mask_signed_words)
    assert failures and all("unsigned" in line for line in failures), "\n".join(failures)


def test_rolling_back_a_refused_guess_is_reported_as_a_kept_token_undone():
    failures = _failed("ch11.guess_masks", guess_masks_roll_back_every_guess)
    line = next(line for line in failures if "exactly the accepted guesses are rolled back" in line)
    assert "the matcher where it was, having accepted" in line and "rollback(" in line


def test_the_graders_matcher_keeps_its_history_and_refuses_to_undo_more_than_it_has():
    matcher = CountingMatcher(NO_NAY, NO_NAY_ACCEPTING, NAY_VOCAB, 0, kept=[1])
    assert matcher.allowed() == {2, 3, 8} and matcher.accept(3) and not matcher.accept(6)
    matcher.rollback(1)
    assert matcher.history == [1]
    with pytest.raises(ValueError, match="cannot roll back 2"):
        matcher.rollback(2)


def test_packing_round_trips():
    assert pack([0, 31, 32, 69], 70) == [1 + 2**31, 1, 32]
    assert unpacked(pack([0, 31, 32, 69], 70), 70) == [0, 31, 32, 69]
    assert unpacked([-1], 32) is None  # signed words are not the engine's layout


def test_the_solution_on_the_chapters_automaton_is_the_librarys_mask():
    """The exercise's rule, on the shipped vocabulary and section 2's automaton, packs to the very words
    xgrammar fills into the engine's bitmask (int32 words, read as unsigned)."""
    import minillm
    from experiments import ch11
    from minillm.structured import StructuredOutput
    from minillm.structured.grammars import GrammarCompiler, Matcher, allocate_bitmask

    tokenizer = minillm.load_tokenizer()
    vocab = ch11.vocabulary(tokenizer, len(tokenizer))
    automaton = ch11.speaker_automaton()
    compiler = GrammarCompiler(tokenizer, len(vocab), [0])
    grammar = compiler.compile(StructuredOutput(regex=ch11.REGEX))
    for prefix in ("", "JUL", "ROMEO:", "ROMEO: the", "ROMEO: the king."):
        matcher = Matcher(grammar)
        for token in tokenizer.encode(prefix, add_special_tokens=False):
            assert matcher.accept(token)
        bitmask = allocate_bitmask(1, len(vocab))
        matcher.fill(bitmask, 0)
        library = [w & 0xFFFFFFFF for w in bitmask[0].tolist()]
        state = automaton.walk(automaton.start, prefix)
        assert token_mask(automaton.transitions, set(automaton.accepting), state, vocab, 0) == library, prefix
    assert bitmask.dtype == torch.int32
    compiler.close()
