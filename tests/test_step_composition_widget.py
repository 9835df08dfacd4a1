"""widgets/step_composition.py: the bars and latencies it draws come from the trace, exactly."""

import pytest

from minillm.trace import SlotState, StepRecord, Trace
from tests.test_chunked_prefill import greedy, make_engine, serve
from widgets.step_composition import StepComposition, composition, inter_token_latencies, render_frame, time_labels


def record(step: int, start: float, duration: float, *slots: tuple | None) -> StepRecord:
    return StepRecord(step, start, duration, tuple(None if s is None else SlotState(*s) for s in slots), (), ())


# a prompt "B" of 7 tokens arrives while "A" decodes: unchunked it is one step of 8 tokens
TRACE = Trace(2, [record(0, 10.0, 0.1, ("A", 3, "prefill"), None),
                  record(1, 10.1, 0.1, ("A", 1, "decode"), None),
                  record(2, 10.2, 0.5, ("A", 1, "decode"), ("B", 7, "prefill")),
                  record(3, 10.7, 0.1, ("A", 1, "decode"), ("B", 1, "decode"))])


def test_composition_stacks_each_steps_tokens_by_kind():
    bars = composition(TRACE)
    assert [b.start for b in bars] == pytest.approx([0.0, 0.1, 0.2, 0.7])
    assert [(b.decode_tokens, b.prefill_tokens) for b in bars] == [(0, (("A", 3),)), (1, ()), (1, (("B", 7),)),
                                                                   (2, ())]
    assert [b.num_tokens for b in bars] == [3, 1, 8, 2]


def test_inter_token_latencies_measure_from_the_previous_token_of_the_same_request():
    points = inter_token_latencies(TRACE)
    # A: first token at 0.1 (its prefill), then 0.2, 0.7 (the stall: B's prefill), 0.8; B: 0.7 then 0.8
    assert [(round(t, 3), round(itl, 3), rid) for t, itl, rid in points] == [
        (0.2, 0.1, "A"), (0.7, 0.5, "A"), (0.8, 0.1, "A"), (0.8, 0.1, "B")]


def test_a_frame_draws_only_the_steps_begun_by_its_time():
    early = render_frame(TRACE, 0.15, "unchunked", 0.8, 8, 0.5)
    late = render_frame(TRACE, 0.8, "unchunked", 0.8, 8, 0.5)
    assert 'data-steps="2"' in early and 'data-steps="4"' in late
    assert "request B: 7 prefill tokens" not in early and "request B: 7 prefill tokens" in late
    assert "longest step 500 ms" in late and "ITL p99 488 ms" in late  # 0.1, 0.1, 0.1, 0.5 s: p99 interpolated
    assert late.count("<polyline") == 2  # one step line per request: A's 3 gaps, B's one
    a_line = late[late.index("<polyline"):]
    points = [tuple(map(float, p.split(","))) for p in a_line[a_line.index('points="') + 8:].split('"')[0].split()]
    # each gap is a flat segment from the previous token to this one: A waited 0.1 s, 0.5 s (the stall), 0.1 s
    x_of = lambda t: 64 + 760 * t / 0.8  # noqa: E731
    assert [round(x) for x, _ in points] == [round(x_of(t)) for t in (0.1, 0.2, 0.2, 0.7, 0.7, 0.8)]
    ys = [y for _, y in points]
    assert ys[0] == ys[1] and ys[2] == ys[3] == 30 and ys[4] == ys[5] == ys[0]  # the 0.5 s gap at the top (max_itl)
    assert "median 100 ms, worst 500 ms (at 0.70 s)" in a_line
    assert "<polyline" not in early


def test_time_labels_stay_distinct_for_a_run_of_milliseconds():
    assert list(time_labels(2.0, 3)) == ["0.000 s / 2.000 s", "1.000 s / 2.000 s", "2.000 s / 2.000 s"]
    short = time_labels(0.009, 12)  # 0.8 ms apart: three decimals would merge neighbours
    assert len(short) == 12 and list(short)[-1] == "0.0090 s / 0.0090 s"
    assert len(time_labels(0.0, 5)) == 1


def test_the_widget_shares_one_time_axis_and_refuses_empty_traces(model):
    runs = {}
    for name, chunk in (("unchunked", None), ("chunked", 8)):
        engine = make_engine(model, "paged", chunk, max_tokens_per_step=64)
        serve(engine, [(0, [5, 6, 7], greedy(16)), (3, list(range(20, 70)), greedy(2))])
        runs[name] = engine.trace
    widget = StepComposition(runs, max_frames=12)
    assert len(widget.slider.options) == 12 == len(widget.stacks[0].children) == len(widget.stacks[1].children)
    span = max(t.steps[-1].start_time + t.steps[-1].duration - t.steps[0].start_time for t in runs.values())
    assert widget.times[-1] == pytest.approx(span) and widget.slider.options[-1] == list(time_labels(span, 12))[-1]
    chunked_last = widget.stacks[1].children[-1].value
    assert "request 1: 8 prefill tokens" in chunked_last  # the 50-token prompt in chunks of 8
    assert "request 1: 50 prefill tokens" in widget.stacks[0].children[-1].value  # unchunked: one step
    assert widget.play.value == 11 == widget.stacks[0].selected_index  # it opens on the whole run
    with pytest.raises(ValueError, match="at least one recorded step"):
        StepComposition({"empty": Trace(2)})


def test_a_preempted_requests_gap_spans_its_whole_wait_and_mid_prompt_chunks_give_no_token():
    # A decodes, is preempted (steps 2-3 it is gone), recomputes 5 tokens in step 4 (which samples), decodes;
    # B's 9-token prompt runs in chunks of 4, 4, 1: only the last chunk gives it a token
    trace = Trace(2, [record(0, 0.0, 0.1, ("A", 3, "prefill"), None),
                      record(1, 0.1, 0.1, ("A", 1, "decode"), ("B", 4, "prefill", False)),
                      record(2, 0.2, 0.1, None, ("B", 4, "prefill", False)),
                      record(3, 0.3, 0.1, None, ("B", 1, "prefill")),
                      record(4, 0.4, 0.1, ("A", 5, "prefill"), ("B", 1, "decode")),
                      record(5, 0.5, 0.1, ("A", 1, "decode"), None)])
    points = [(round(t, 3), round(itl, 3), rid) for t, itl, rid in inter_token_latencies(trace)]
    assert points == [(0.2, 0.1, "A"), (0.5, 0.3, "A"), (0.5, 0.1, "B"), (0.6, 0.1, "A")]


def test_gaps_match_the_engines_tokens_under_preemption_and_chunking(model):
    """From a real trace: every request's gaps are one fewer than its tokens, and add up to the time
    between the steps that gave its first and its last token (a preemption's wait included)."""
    engine = make_engine(model, "paged", 4, num_blocks=10, max_tokens_per_step=12)
    prompts = [list(range(10 + 7 * i, 24 + 7 * i)) for i in range(3)]
    outputs = serve(engine, [(0, p, greedy(14)) for p in prompts])
    assert any(s.preempted for s in engine.trace.steps), "the pool is meant to be too small for all three"
    points = inter_token_latencies(engine.trace)
    origin = engine.trace.steps[0].start_time
    for rid, tokens in zip(["0", "1", "2"], outputs):
        gaps = [(t, itl) for t, itl, r in points if r == rid]
        assert len(gaps) == len(tokens) - 1
        ends = [s.start_time + s.duration - origin for s in engine.trace.steps
                if any(x is not None and x.request_id == rid and x.sampled and x.num_tokens for x in s.slots)]
        assert len(ends) == len(tokens)
        assert sum(itl for _, itl in gaps) == pytest.approx(ends[-1] - ends[0])


def test_bars_are_cut_at_the_cursor_and_use_a_square_root_scale():
    frame = render_frame(TRACE, 0.45, "t", 0.8, 8, 0.5)  # step 2 (0.2 .. 0.7 s) is half drawn
    bar = frame[frame.index("request B: 7 prefill") - 200: frame.index("request B: 7 prefill")]
    width = float(bar.split('width="')[-1].split('"')[0])
    assert width == pytest.approx(760 * 0.25 / 0.8 - 0.5, abs=0.2)
    heights = {n: float(frame.split(f"<title>{n} decode tokens")[0].rsplit('height="', 1)[1].split('"')[0])
               for n in (1,)}
    assert heights[1] == pytest.approx(110 * (1 / 8) ** 0.5, abs=0.1)
