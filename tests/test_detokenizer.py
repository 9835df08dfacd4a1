"""Incremental detokenisation: deltas add up to the full text, never hold half a character, and
stop strings cut the text before them."""

import pytest

from minillm.detokenizer import IncrementalDetokenizer
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
