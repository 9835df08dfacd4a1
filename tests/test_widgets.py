"""Widget rendering is a pure function of the data: checked here without a browser."""

import json
import re
from pathlib import Path

import pytest

from minillm.trace import SlotState, StepRecord, Trace
from widgets.prefill_decode import HARDWARE, MODELS, step_cost
from widgets.quiz import Question, load_questions, render_quiz
from widgets.slot_timeline import frame_steps, render_frame, request_colour


def tiny_trace() -> Trace:
    a_prefill, a = SlotState("0", 5, "prefill"), SlotState("0", 1, "decode")
    b_prefill, b, b_idle = SlotState("1", 3, "prefill"), SlotState("1", 1, "decode"), SlotState("1", 0, "idle")
    steps = [StepRecord(0, 0.0, 0.01, (a_prefill, b_prefill), ("0", "1"), ()),
             StepRecord(1, 0.01, 0.01, (a, b), (), ("1",)),
             StepRecord(2, 0.02, 0.01, (a, b_idle), (), ()),
             StepRecord(3, 0.03, 0.01, (a, None), (), ("0",))]
    return Trace(num_slots=2, steps=steps)


def test_frames_grow_with_the_step_and_show_idle_slots():
    trace = tiny_trace()
    first, last = render_frame(trace, 0, "t"), render_frame(trace, 3, "t")
    assert first.startswith("<svg") and 'data-step="0"' in first and 'data-step="3"' in last
    assert first != last
    assert "#d9d9d9" in last and "#d9d9d9" not in first  # the idle cell appears at step 2
    assert "slot utilisation 75%" in last  # 6 busy slot-steps of 8


def test_trace_round_trips_through_plain_data():
    trace = tiny_trace()
    again = Trace.from_dict(trace.to_dict())
    assert again == trace and again.slot_utilisation == pytest.approx(0.75)


def test_frame_subsampling_keeps_the_last_step():
    assert frame_steps(5, 80) == [0, 1, 2, 3, 4]
    picks = frame_steps(1000, 50)
    assert len(picks) <= 51 and picks[0] == 0 and picks[-1] == 999 and picks == sorted(picks)


def test_neighbouring_requests_get_distinct_colours():
    assert len({request_colour(str(i)) for i in range(12)}) == 12


def test_decode_is_memory_bound_and_prefill_compute_bound_on_a_gpu():
    llama, h200 = MODELS["Llama-3-8B (bf16)"], HARDWARE["NVIDIA H200 (bf16)"]
    prefill = step_cost(llama, "prefill", batch=1, prompt_len=2048, context_len=0, hw=h200)
    decode = step_cost(llama, "decode", batch=1, prompt_len=2048, context_len=2048, hw=h200)
    assert prefill["bound"] == "compute" and decode["bound"] == "memory bandwidth"
    assert 14e9 < decode["weight_bytes"] < 17e9  # ~8B parameters in bf16
    big_batch = step_cost(llama, "decode", batch=256, prompt_len=1, context_len=128, hw=h200)
    assert big_batch["intensity"] > 50 * decode["intensity"]  # batching raises decode's intensity
    with pytest.raises(ValueError, match="phase"):
        step_cost(llama, "verify", 1, 1, 1, h200)


def test_every_option_is_a_lettered_click_that_answers_back():
    html = render_quiz([Question("2+2?", ("3", "4", "5"), 1, "Because.", why_not=("One short.", None, None))])
    options = re.findall(r"<details class='quiz-option' data-correct='(\w+)'><summary[^>]*>"
                         r"<b>([A-H])\.</b> (\d)</summary><p[^>]*>(.*?)</p></details>", html)
    assert [(c, letter, text) for c, letter, text, _ in options] == [("false", "A", "3"), ("true", "B", "4"),
                                                                   ("false", "C", "5")]
    verdicts = [v for *_, v in options]
    assert "✓ Right." in verdicts[1] and "Because." in verdicts[1]
    assert "✗ Not this one." in verdicts[0] and "One short." in verdicts[0] and "Try another" in verdicts[2]
    assert "<script" not in html  # plain HTML: it works without a kernel or JavaScript


def test_code_in_backticks_shows_as_code_and_html_stays_escaped():
    html = render_quiz([Question("Which call replays `graph`?", ("`graph.replay()`", "<b>x</b>"), 0, "`replay` <i>")])
    assert "Which call replays <code>graph</code>?" in html and "<code>graph.replay()</code>" in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<code>replay</code> &lt;i&gt;" in html and "`" not in html


@pytest.mark.parametrize("kwargs, message", [
    (dict(options=("a", "b"), answer=3), "answer must index"),
    (dict(options=("a",), answer=0), "2 to 8 options"),
    (dict(options=("a", "b"), answer=0, why_not=("x",)), "one entry per option"),
])
def test_malformed_questions_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Question("?", explanation="", **kwargs)


def test_slot_timeline_names_the_step_and_carries_a_still():
    from widgets.slot_timeline import SlotTimeline

    widget = SlotTimeline({"static": tiny_trace()})
    steps = len(tiny_trace().steps)
    assert widget.slider.options[-1] == f"step {steps - 1} / {steps - 1}"  # the slider says what the panel says
    bundle = widget._repr_mimebundle_()
    assert 'class="slot-timeline"' in bundle["text/html"] and f'data-step="{steps - 1}"' in bundle["text/html"]


CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_shows_its_own_quiz_without_its_answers_in_view(notebook):
    """The quiz cell names the chapter's own quiz module, and no answer index sits in the notebook's source."""
    cells = json.loads(notebook.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    chapter = f"ch{notebook.name[:2]}"
    assert sum(f'show_quiz("{chapter}")' in s for s in sources) == 1
    assert not any("Question(" in s for s in sources)
    questions = load_questions(chapter)
    assert len(questions) >= 3 and all(isinstance(q, Question) for q in questions)


@pytest.mark.parametrize("name", ["05", "ch5", "ch05; import os", "../ch05"])
def test_a_quiz_is_named_like_ch05(name):
    with pytest.raises(ValueError, match="named like"):
        load_questions(name)
