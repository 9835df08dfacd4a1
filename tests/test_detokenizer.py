"""Incremental detokenisation: deltas add up to the full text, never hold half a character, and
stop strings cut the text before them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.detokenizer import CONTEXT_TOKENS, IncrementalDetokenizer
from minillm.model import load_tokenizer

TEXTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "Emoji 🙂🚀 and CJK 中文字 and accents: café, naïve — done.",
    "  leading spaces,\ttabs\n\nand blank lines  ",
    "What is 1+1? Answer: 2",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("target")


def stream(tokenizer, text, stop=()):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=tokenizer.encode("Prompt:"), stop=stop)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    return deltas, detok


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_and_never_split_a_character(tokenizer, text):
    deltas, detok = stream(tokenizer, text)
    assert "".join(deltas) == detok.text == tokenizer.decode(tokenizer.encode(text)) == text
    assert not any("\ufffd" in d for d in deltas)


def test_multibyte_characters_span_several_tokens(tokenizer):
    ids = tokenizer.encode("🙂")
    assert len(ids) > 1  # so the test above really exercises the hold-back of partial bytes


def test_stop_string_cuts_the_text_and_is_never_streamed(tokenizer):
    deltas, detok = stream(tokenizer, TEXTS[0], stop=("light",))
    assert detok.text == "ROMEO:\nBut soft, what "
    assert "".join(deltas) == detok.text
    assert detok.stopped_by == "light"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    _, detok = stream(tokenizer, TEXTS[0], stop=("window", "soft", "ROMEO"))
    assert detok.text == "" and detok.stopped_by == "ROMEO"
    _, detok = stream(tokenizer, TEXTS[0], stop=("window", "soft"))
    assert detok.text == "ROMEO:\nBut " and detok.stopped_by == "soft"


def test_text_that_might_start_a_stop_string_is_held_back_then_released(tokenizer):
    deltas, detok = stream(tokenizer, "abc xyz abd", stop=("abd!",))
    assert detok.stopped_by is None
    assert "".join(deltas) == "abc xyz abd"


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(0, 4095), max_size=40), context=st.lists(st.integers(0, 4095), max_size=8),
       skip=st.booleans(), stop=st.sampled_from([(), ("e",), ("\n\n", "th")]))
def test_the_tokenizers_stream_and_the_two_decode_rule_give_the_same_deltas(tokenizer, ids, context, skip, stop):
    """The fast tokenizer's DecodeStream (each token decoded once) against the rule it replaces
    (decode(context + new) - decode(context)), on any ids: broken UTF-8, special tokens, stop strings."""
    def deltas(streamed: bool) -> tuple[list[str], str, str | None]:
        detok = IncrementalDetokenizer(tokenizer, context, stop, skip_special_tokens=skip)
        # the shipped tokenizer is a fast one: it streams, unless the context ends inside a character
        # (judged on the context as the detokenizer reads it: its last CONTEXT_TOKENS, special tokens skipped
        # when asked — a context ending "<broken byte><special>" ends inside a character once the special goes)
        tail = tokenizer.decode(context[-CONTEXT_TOKENS:], skip_special_tokens=skip, clean_up_tokenization_spaces=False)
        assert (detok._stream is not None) == (not tail.endswith("\ufffd"))
        if not streamed:
            detok._stream = None
        out = [detok.push(i) for i in ids] + [detok.flush()]
        return out, detok.text, detok.stopped_by

    assert deltas(True) == deltas(False)
