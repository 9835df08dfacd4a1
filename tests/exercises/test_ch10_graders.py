"""ch10's FAIL lines name the rule a wrong answer broke: work that grows with the text is reported by the
work rule alone (its text is right), and a half character released is reported where it first goes out."""

from __future__ import annotations

from exercises.grading import run
from exercises.grading.ch10 import CountingDecode, Reference, decode, encode
from tests.exercises.wrong_answers import DecodesTheWholeOutputEveryStep, HoldsBackAFixedLength, ReleasesHalfCharacters


def _failed(name, impl) -> list[str]:
    return [r.line() for r in run(name, impl) if not r.passed]


def test_quadratic_work_is_reported_by_the_work_rule_alone():
    failures = _failed("ch10.output_processor", DecodesTheWholeOutputEveryStep)
    assert len(failures) == 1 and "decode is given a few ids per token" in failures[0], "\n".join(failures)
    assert "per token and growing with the text" in failures[0]


def test_a_half_character_is_reported_with_the_calls_that_led_to_it():
    failures = _failed("ch10.output_processor", ReleasesHalfCharacters)
    first = failures[0]
    assert "released only once the character is complete" in first and "process([195] = b'\\xc3', None)" in first
    assert "expected ('', None, None)" in first and "got ('\ufffd', None, None)" in first


def test_a_fixed_hold_back_is_reported_as_a_hold_back_at_the_call_it_breaks():
    # a learner's walk found this answer's first FAIL, under the stop-string rule, pointing at stop detection
    failures = _failed("ch10.output_processor", HoldsBackAFixedLength)
    assert failures, "a fixed hold-back passed"
    first = failures[0]
    assert ("no stop string begins with any end of the text: everything goes out" in first
            or "is held back — the longest end of the text that could still begin one of" in first), first


def test_the_graders_tokenizer_cuts_characters_and_counts_what_it_decodes():
    ids = encode("Café 🙂")
    assert decode(ids) == "Café 🙂" and decode(ids[:4]).endswith("\ufffd") and len(ids) == 8
    counting = CountingDecode()
    counting(ids[:3])
    assert counting.ids == 3
    reference = Reference("r", ["ab"])
    assert reference.process(encode("xa"), None) == ("x", None, None)
    delta, finish, message = reference.process(encode("b!"), None)
    assert (delta, finish, message.request_id) == ("", "stop", "r")
