"""widgets/grammar_replay.py: a frame says what the mask allowed, which token was chosen and where the
grammar stood; frames are pure, escaped, and the widget plays them without a kernel."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from widgets.grammar_replay import GrammarReplay, percent, render_frame, shown, still_index


@dataclass(frozen=True)
class Step:  # the attributes of experiments/ch11.py::ReplayStep the widget reads
    piece: str
    text: str
    allowed: int
    top: tuple
    wanted: tuple
    kept_mass: float
    chosen_p: float
    where: tuple
    forced: str = ""


STEPS = [
    Step("{", "", 1, (("{", 1.0),), ("I", 0.07), 0.0, 1.0, ("$", "", "before the first character: a value must start"),
         '{"name": "'),
    Step('{"', "{", 1, (('{"', 1.0),), ('{"', 0.5), 0.5, 1.0, ("$", "{", "a key (or the closing brace) next")),
    Step("<b>", '{"name": "', 2703, (("<b>", 0.6), (" the", 0.3), ("\n", 0.1)), ("\n", 0.4), 0.012, 0.6,
         ("$.name", "{", "inside a string value")),
    Step("<end of text>", '{"name": "<b>"}', 1, (("<end of text>", 1.0),), ("s", 0.15), 1e-6, 1.0,
         ("$", "", "the JSON value is complete")),
]


def test_a_frame_says_what_was_allowed_and_chosen_and_where_the_grammar_stands():
    frame = render_frame(STEPS, 2, 4096, "demo")
    assert frame.startswith("<svg") and 'class="grammar-replay"' in frame and 'data-step="2"' in frame
    assert "step 3 / 4" in frame and "allowed 2,703 of 4,096 tokens (65.99%)" in frame
    assert "&lt;b&gt;" in frame and "<b>" not in frame
    assert "$.name" in frame and "inside a string value" in frame and "… and 2,700 more" in frame
    assert "favourite was &#x27;⏎&#x27; (40%), which the grammar refused" in frame
    assert "held 1.2% of its probability" in frame and "(the chosen one 60%)" in frame


def test_frames_are_pure_and_escape_the_text():
    assert render_frame(STEPS, 1, 4096) == render_frame(STEPS, 1, 4096)
    frame = render_frame(STEPS, 3, 4096)
    assert "<b>" not in frame and "&lt;end of text&gt;" in frame and "the JSON value is complete" in frame
    assert "held under 0.1% of its probability" in frame
    assert render_frame(STEPS, -1, 4096) == frame  # the last step
    first = render_frame(STEPS, 0, 4096)
    assert "forces next: {&quot;name&quot;: &quot;" in first
    assert 'open: </tspan><tspan font-family="monospace">none' in first
    with pytest.raises(ValueError):
        render_frame([], 0, 4096)


def test_where_the_output_is_long_the_frame_shows_its_end():
    long = [Step("x", "a" * 500 + "END", 3000, (("x", 1.0),), ("x", 1.0), 1.0, 1.0, ("$", "{", "inside"))]
    frame = render_frame(long, 0, 4096)
    assert "…" in frame and "END" in frame and "a" * 200 not in frame
    assert "this same token (100%): here the mask changed nothing" in frame


def test_helpers():
    assert shown(" ") == "␣" and shown("\n") == "⏎" and shown(" the") == " the"
    assert percent(0.6) == "60%" and percent(0.012) == "1.2%" and percent(0.0001) == "under 0.1%" and percent(0) == "0%"
    assert still_index(STEPS) == 2  # the step where the mask overruled the model and still left a choice
    assert still_index(STEPS[:2]) == 0


def test_the_widget_plays_every_step_and_carries_a_still():
    widget = GrammarReplay(STEPS, 4096, title="demo")
    assert len(widget.stacks[0].children) == len(STEPS) and widget.play.max == len(STEPS) - 1
    assert widget.slider.options[-1] == "step 4 / 4"
    bundle = widget._repr_mimebundle_()
    assert 'class="grammar-replay"' in bundle["text/html"] and 'data-step="2"' in bundle["text/html"]
    with pytest.raises(ValueError):
        GrammarReplay([], 4096)
