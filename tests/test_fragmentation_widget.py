"""The fragmentation visualizer replays a trace under three policies; exact numbers on a hand-made trace."""

import dataclasses

import pytest

from minillm.trace import StepRecord, Trace
from widgets.fragmentation import FragmentationVisualizer, render_frame, replay


def hand_trace() -> Trace:
    """32 tokens of KV in 8 blocks of 4; max_model_len 16.
    step 0: A holds 5 tokens (blocks 0, 1), B 3 (block 2), C 6 (blocks 3, 4)
    step 1: A finished; B 4, C 7; D arrives with 9 tokens (blocks 1, 0, 5)"""
    steps = [StepRecord(0, 0.0, 0.01, (), ("A", "B", "C"), (), (), {"A": 5, "B": 3, "C": 6},
                        {"A": (0, 1), "B": (2,), "C": (3, 4)}),
             StepRecord(1, 0.01, 0.01, (), ("D",), ("A",), (), {"B": 4, "C": 7, "D": 9},
                        {"B": (2,), "C": (3, 4), "D": (1, 0, 5)})]
    return Trace(num_slots=4, steps=steps, max_model_len=16, block_size=4, num_blocks=8)


def test_paged_replay_uses_the_real_blocks():
    first, second = replay(hand_trace(), "paged")
    assert (first.live, first.allocated, first.free) == (14, 20, 12)
    assert first.internal_fragmentation == pytest.approx(6 / 20) and first.external_fragmentation == 0
    assert (second.live, second.allocated) == (20, 24)
    assert second.fits(8) and not second.fits(9)  # 2 free blocks = 8 tokens, wherever they are


def test_reservation_runs_out_of_slots():
    first, second = replay(hand_trace(), "reserve")
    # 32 tokens / 16 per request = 2 slots: C has no room at step 0
    assert first.num_requests == 2 and first.unplaced == ("C",)
    assert (first.live, first.allocated) == (8, 32)
    assert not first.fits(1)
    # A left: C takes its slot, D still has none
    assert {s.request_id for s in second.segments} == {"B", "C"} and second.unplaced == ("D",)


def test_first_fit_leaves_holes():
    first, second = replay(hand_trace(), "first-fit")
    # exact final sizes: A 5, B 4, C 7 -> A [0, 5), B [5, 9), C [9, 16)
    assert [(s.request_id, s.start, s.length) for s in first.segments] == [("A", 0, 5), ("B", 5, 4), ("C", 9, 7)]
    # A leaves a 5-token hole at the front; D (9) goes after C at 16
    assert [(s.request_id, s.start) for s in second.segments] == [("B", 5), ("C", 9), ("D", 16)]
    assert second.holes() == [(0, 5), (25, 7)]
    assert second.external_fragmentation == pytest.approx(1 - 7 / 12)
    assert second.fits(7) and not second.fits(8)  # 12 tokens free, but no hole of 8


def test_frames_render_and_the_widget_animates():
    trace = hand_trace()
    frames = {p: replay(trace, p)[1] for p in ("reserve", "first-fit", "paged")}
    svg = render_frame(frames, probe=8)
    assert svg.startswith("<svg") and 'class="kv-memory"' in svg and 'data-step="1"' in svg
    assert "no room for 1 running request" in svg and "yes ✓" in svg and "no ✗" in svg
    widget = FragmentationVisualizer(trace, probe=8)
    assert len(widget.stacks[0].children) == 2 and widget.play.max == 1
    assert widget.slider.options == ("step 0 / 1", "step 1 / 1")  # the slider names the engine step
    bundle = widget._repr_mimebundle_()
    assert 'class="kv-memory"' in bundle["text/html"]  # a still where widgets cannot render
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_replay_needs_a_paged_trace():
    with pytest.raises(ValueError, match="paged"):
        replay(Trace(num_slots=2), "paged")
    with pytest.raises(ValueError, match="policy"):
        replay(hand_trace(), "buddy")


def test_a_paged_trace_round_trips_through_plain_data():
    import json

    trace = hand_trace()
    again = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert again == trace
    assert [f.segments for f in replay(again, "paged")] == [f.segments for f in replay(trace, "paged")]


def test_an_empty_trace_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="holds no KV"):
        FragmentationVisualizer(Trace(num_slots=2, max_model_len=16, block_size=4, num_blocks=8))


def test_the_animation_skips_steps_where_nothing_is_held():
    trace = hand_trace()
    done = dataclasses.replace(trace.steps[-1], step=len(trace.steps), kv_tokens={}, blocks={})
    widget = FragmentationVisualizer(Trace(trace.num_slots, [*trace.steps, done], trace.max_model_len,
                                           trace.block_size, trace.num_blocks))
    assert widget.frame_steps == [0, 1], "the last frame must not be three empty panels"
