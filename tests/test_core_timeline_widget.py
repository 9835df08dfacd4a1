"""minillm/engine_core/timeline.py and widgets/core_timeline.py: spans recorded only when asked for, nested
spans flattened into the pieces a picture draws, a recording's shares and overlaps, the real engine's phases
recorded in one process and across the process split, and the widget drawing exactly the window it names."""

import asyncio
import contextlib
import json

import pytest

from minillm import EngineConfig, SamplingParams
from minillm.async_engine import AsyncLLM
from minillm.engine import LLMEngine
from minillm.engine_core.core import EngineCore
from minillm.engine_core.messages import CoreStep
from minillm.timeline import KINDS, WORKER, Recording, Span, Timeline, flatten, instrument, span
from tests.hf_reference import ByteTokenizer
from widgets.core_timeline import COLOURS, CoreTimeline, frame_times, render_frame


def test_a_timeline_records_spans_and_off_costs_nothing():
    timeline = Timeline("front end")
    with timeline.span("detokenize"):
        pass
    assert timeline.call("tokenize", lambda a, b: a + b, 2, 3) == 5
    timeline.add("forward", 1.0, 2.0, lane="core")
    lanes = [(s.lane, s.kind) for s in timeline.spans]
    assert lanes == [("front end", "detokenize"), ("front end" + WORKER, "tokenize"), ("core", "forward")]
    assert all(s.end >= s.start for s in timeline.spans)
    assert len(timeline.drain()) == 3 and timeline.spans == []
    with pytest.raises(ValueError, match="kind"):
        timeline.add("thinking", 0.0, 1.0)
    off = span(None, "receive")
    assert off is span(None, "forward") and isinstance(off, contextlib.nullcontext)  # one shared do-nothing context
    assert set(COLOURS) == set(KINDS)


def test_nested_spans_flatten_to_their_innermost_piece():
    spans = [Span("core", "update", 0, 10), Span("core", "schedule", 1, 2), Span("core", "forward", 3, 8),
             Span("core", "sample", 6, 7), Span("front end", "detokenize", 4, 5), Span("core", "update", 9, 9)]
    assert flatten(spans) == [
        Span("core", "update", 0, 1), Span("core", "schedule", 1, 2), Span("core", "update", 2, 3),
        Span("core", "forward", 3, 6), Span("core", "sample", 6, 7), Span("core", "forward", 7, 8),
        Span("core", "update", 8, 10), Span("front end", "detokenize", 4, 5)]
    # touching pieces of one kind become one; overlapping workers of one lane too
    assert flatten([Span("w", "tokenize", 0, 2), Span("w", "tokenize", 1, 3), Span("w", "tokenize", 3, 4)]) == [
        Span("w", "tokenize", 0, 4)]


def _recording() -> Recording:
    spans = [Span("core", "forward", 1.0, 1.004), Span("core", "send", 1.004, 1.005),
             Span("front end", "detokenize", 1.002, 1.003), Span("front end", "send to client", 1.005, 1.006),
             Span("front end" + WORKER, "tokenize", 0.9995, 1.0005), Span("core", "forward", 1.007, 1.011)]
    return Recording.of("after", spans, start=1.0, end=1.010, tokens=8, steps=2, mode="process")


def test_a_recording_is_cut_to_its_run_and_counts_its_work():
    rec = _recording()
    assert rec.lanes == ["front end", "front end" + WORKER, "core"]  # the front end first, its worker under it
    assert rec.wall_ms == pytest.approx(10)
    tokenize = next(s for s in rec.spans if s.kind == "tokenize")
    assert (tokenize.start, tokenize.end) == pytest.approx((0, 0.5))  # cut at the run's start
    assert rec.busy_ms(["forward"]) == pytest.approx(7)  # 4 ms, and 3 of the second before the run's end
    assert rec.share()["forward"] == pytest.approx(0.7) and "receive" not in rec.share()
    assert rec.overlap_ms(["detokenize", "send to client"], ["forward"]) == pytest.approx(1)
    assert rec.overlap_ms(["forward"], ["forward"]) == pytest.approx(7)
    again = Recording.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert again.lanes == rec.lanes and again.info == rec.info and again.tokens == 8
    assert [(s.lane, s.kind) for s in again.spans] == [(s.lane, s.kind) for s in rec.spans]
    assert all(a.start == pytest.approx(b.start) and a.end == pytest.approx(b.end) for a, b in zip(again.spans,
                                                                                                    rec.spans))


def test_frames_draw_the_window_they_name():
    rec = _recording()
    early = render_frame([rec], t_ms=3.0, window_ms=3.0)
    assert early.startswith("<svg") and 'class="core-timeline"' in early and 'data-step="3.0"' in early
    assert "0.0 – 3.0 ms" in early and ">front end</text>" in early and ">core</text>" in early
    assert ">worker thread</text>" in early
    assert "detokenize + stop strings: 1.000 ms" in early  # its piece in the window, with its duration
    assert "SSE line to the client: 1.000 ms" not in early  # 5-6 ms: outside the window
    late = render_frame([rec], t_ms=12.0, window_ms=3.0)
    assert "forward: 3.000 ms" in late and "run over at 10 ms" in late and "detokenize + stop strings:" not in late
    assert all(colour in early for colour in COLOURS.values())  # every kind in the legend
    assert frame_times(10, 3, 40) == pytest.approx([3 + 7 * i / 4 for i in range(5)])
    assert frame_times(2, 3, 40) == [3] and len(frame_times(1000, 1, 40)) == 40


def test_the_widget_opens_at_the_start_shows_the_middle_still_and_refuses_empty_recordings():
    rec = _recording()
    widget = CoreTimeline([rec, rec], window_ms=1.0, max_frames=9)
    assert len(widget.slider.options) == 9 and widget.play.value == 0  # ▶ plays the whole runs
    assert widget.still_html() == widget.stacks[0].children[4].value  # a page without widgets: the middle
    assert len(set(widget.slider.options)) == 9
    assert widget.stacks[0].children[4].value.count("<svg") == 1
    assert 'class="core-timeline"' in widget._repr_mimebundle_()["text/html"]
    with pytest.raises(ValueError, match="at least one span"):
        CoreTimeline([Recording("empty", [], [], 1.0, 0)])


def test_instrumenting_an_engine_records_its_phases_and_undoes_cleanly(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(kv="paged", max_num_seqs=2, max_model_len=64))
    timeline = Timeline("server")
    undo = instrument(engine, timeline)
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    kinds = [s.kind for s in timeline.spans]
    assert {"update", "schedule", "forward", "sample", "detokenize"} <= set(kinds)
    assert kinds.count("update") == kinds.count("schedule") == 4  # one step each
    undo()
    assert not {"step", "_emit", "schedule", "execute", "_sample"} & (set(vars(engine)) | set(vars(engine.scheduler))
                                                                      | set(vars(engine.runner)))
    for request_id in list(engine.requests):
        engine.release(request_id)


def test_asyncllm_records_both_sides_only_when_asked(model):
    async def serve(llm):
        return await asyncio.gather(*(llm.submit(p, SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True))
                                      for p in ("ab", "cde")))

    tokenizer = ByteTokenizer()
    timeline = Timeline("server")
    recorded = AsyncLLM(engine=LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=2, max_model_len=64)),
                        timeline=timeline)
    plain = AsyncLLM(engine=LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=2, max_model_len=64)))
    with_timeline, without = asyncio.run(serve(recorded)), asyncio.run(serve(plain))
    assert [o.token_ids for o in with_timeline] == [o.token_ids for o in without]
    kinds = {(s.lane, s.kind) for s in timeline.spans}
    assert {("server", k) for k in ("receive", "schedule", "forward", "sample", "detokenize", "update")} <= kinds
    assert ("server" + WORKER, "tokenize") in kinds
    assert "step" not in vars(plain.engine) and plain.timeline is None


def test_the_core_ships_its_spans_only_with_a_timeline(model):
    steps = {}
    for on in (False, True):
        engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=2, max_model_len=64), detokenize=False)
        timeline = Timeline("core") if on else None
        if on:
            instrument(engine, timeline)
        core = EngineCore(engine, None, None, parent_pid=0, timeline=timeline)
        engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True),
                           request_id="r")
        core.live.add("r")
        steps[on] = [core._step() for _ in range(3)]
        assert not engine.has_unfinished()
    assert all(isinstance(s, CoreStep) and s.spans == [] for s in steps[False])
    shipped = [s for step in steps[True] for s in step.spans]
    assert {s.kind for s in shipped} >= {"update", "schedule", "forward", "sample"}
    assert all(s.lane == "core" for s in shipped) and "detokenize" not in {s.kind for s in shipped}


def test_a_process_split_run_brings_the_cores_spans_home():
    from minillm.engine_core import ProcessAsyncLLM

    timeline = Timeline("front end")
    llm = ProcessAsyncLLM(config=EngineConfig(max_num_seqs=4, max_model_len=128), threads=1, timeline=timeline)
    try:
        async def go():
            params = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
            outs = await asyncio.gather(*(llm.submit(p, params) for p in ("ROMEO:", "JULIET:")))
            await asyncio.sleep(0.1)  # the last step's spans come with it
            return outs

        outs = asyncio.run(go())
    finally:
        llm.close()
    assert all(len(o.token_ids) == 6 for o in outs)
    kinds = {(s.lane, s.kind) for s in timeline.spans}
    assert {("front end", "receive"), ("front end", "detokenize"), ("front end" + WORKER, "tokenize")} <= kinds
    assert {("core", k) for k in ("schedule", "forward", "sample", "update", "send")} <= kinds
