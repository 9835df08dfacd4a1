"""widgets/rank_lanes.py: a rank's steps split exactly into compute, collectives and idle; frames that slide and
say which they are; transfers drawn as labelled arrows cut to the window; labels that never overlap; a run
that recorded nothing saying so; and a real two-rank engine's records replayed."""

from __future__ import annotations

import gc
import html
import itertools
import random
import re
import time

import psutil
import pytest

from minillm.config import EngineConfig
from minillm.distributed.communicator import Collective
from minillm.engine import LLMEngine
from minillm.model import load_model
from minillm.sampling import SamplingParams
from tests.hf_reference import make_checkpoint
from widgets.rank_lanes import (
    CHAR_W,
    COLOURS,
    LEFT,
    PLOT_W,
    Lane,
    LaneSpan,
    RankLanes,
    Transfer,
    frame_labels,
    lanes_from_collectives,
    render_frame,
    shares,
)

# Two steps per rank, each rank's records in the order a drain gives them (a step after its collectives).
# rank 0: step [0, 4]: all-reduce [1, 2], gather [3, 4]; step [6, 10]: all-reduce [7, 8.5], gather [9.5, 10]
# rank 1: step [0.5, 4]: all-reduce [1.5, 2], gather [3.5, 4]; step [6, 10]: all-reduce [8, 8.5], gather [9.8, 10]
C = Collective
RECORDS = {
    1: [C("all-reduce", 1.5, 2.0, 1024), C("gather", 3.5, 4.0, 512), C("step", 0.5, 4.0, 0),
        C("all-reduce", 8.0, 8.5, 256), C("gather", 9.8, 10.0, 512), C("step", 6.0, 10.0, 0)],
    0: [C("all-reduce", 1.0, 2.0, 1024), C("gather", 3.0, 4.0, 512), C("step", 0.0, 4.0, 0),
        C("all-reduce", 7.0, 8.5, 256), C("gather", 9.5, 10.0, 512), C("step", 6.0, 10.0, 0)],
}


def _texts(svg: str) -> list[tuple[float, float, float, float, str]]:
    """Every <text>'s box (left, top, right, bottom) and words, from its position, anchor and the widget's upper
    bound on a character's width (font-size 11 unless the element says otherwise)."""
    boxes = []
    for attrs, words in re.findall(r"<text([^>]*)>([^<]*)</text>", svg):
        x, y = float(re.search(r' x="([-\d.]+)"', attrs).group(1)), float(re.search(r' y="([-\d.]+)"', attrs).group(1))
        size = float(re.search(r'font-size="([\d.]+)"', attrs).group(1)) if "font-size" in attrs else 11.0
        width = len(html.unescape(words)) * CHAR_W * size / 11 * (1.1 if "bold" in attrs else 1.0)
        anchor = re.search(r'text-anchor="(\w+)"', attrs)
        left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor.group(1) if anchor else "start"]
        boxes.append((left, y - 0.8 * size, left + width, y + 0.25 * size, html.unescape(words)))
    return boxes


def assert_no_label_overlaps(svg: str) -> None:
    boxes = _texts(svg)
    width = float(re.search(r'<svg[^>]* width="([\d.]+)"', svg).group(1))
    for a, b in itertools.combinations(boxes, 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], f"labels overlap: {a[4]!r} and {b[4]!r}"
    for box in boxes:
        assert box[0] >= 0 and box[2] <= width, f"label outside the picture: {box[4]!r}"


def test_a_step_outside_its_collectives_is_compute_and_outside_any_step_idle():
    lanes = lanes_from_collectives(RECORDS)
    assert [lane.name for lane in lanes] == ["rank 0 (engine)", "rank 1"]
    assert [(s.kind, s.start, s.end) for s in lanes[0].spans] == [
        ("compute", 0.0, 1.0), ("all-reduce", 1.0, 2.0), ("compute", 2.0, 3.0), ("gather", 3.0, 4.0),
        ("compute", 6.0, 7.0), ("all-reduce", 7.0, 8.5), ("compute", 8.5, 9.5), ("gather", 9.5, 10.0)]
    assert lanes[0].spans[1].label == "1.0 KiB sent by this rank" and lanes[0].spans[5].label.startswith("256 B")
    share = shares(lanes)
    assert share["rank 0 (engine)"] == pytest.approx({"compute": 0.4, "all-reduce": 0.25, "gather": 0.15, "idle": 0.2})
    # rank 1 began 0.5 s late and arrived at its collectives later: more compute, less waiting, more idle
    assert share["rank 1"] == pytest.approx({"compute": 0.58, "all-reduce": 0.1, "gather": 0.07, "idle": 0.25})
    assert list(share["rank 1"]) == ["compute", "all-reduce", "gather", "idle"]  # the table's order
    # a window's summary line: [2, 6] s of rank 0 is compute [2, 3], gather [3, 4], idle [4, 6]
    frame = render_frame(lanes, [], t_end=6.0, window=4.0)
    assert ">compute 25% · gather 25% · idle 50%<" in frame
    assert ">compute 38% · gather 12% · idle 50%<" in frame  # rank 1's: 1.5 s, 0.5 s, 2 s


def test_nested_and_overlapping_spans_give_their_time_to_the_inner_one():
    lanes = [Lane("prefill worker", [LaneSpan("prefill", 0.0, 10.0), LaneSpan("send KV", 8.0, 9.0),
                                     LaneSpan("idle", 10.0, 12.0)]),
             Lane("decode worker", [LaneSpan("decode", 2.0, 12.0)])]
    share = shares(lanes)  # (an "idle" span is the lane's background, though it counts in the run's extent)
    assert share["prefill worker"] == pytest.approx({"prefill": 9 / 12, "send KV": 1 / 12, "idle": 2 / 12})
    assert share["decode worker"] == pytest.approx({"decode": 10 / 12, "idle": 2 / 12})
    many = {0: [c for i in range(5000) for c in (Collective("step", i, i + 0.5, 0),
                                                  Collective("all-reduce", i + 0.1, i + 0.2, 8))]}
    began = time.perf_counter()
    assert shares(lanes_from_collectives(many))["rank 0 (engine)"]["all-reduce"] == pytest.approx(0.1 / 4999.5 * 5000)
    assert time.perf_counter() - began < 2.0  # a long run's records (20,000 kept per rank): not quadratic


def test_frames_slide_and_say_which_frame_they_are():
    widget = RankLanes(lanes_from_collectives(RECORDS), window=2.0, max_frames=6)
    frames = [w.value for w in widget.stacks[0].children]
    assert len(frames) == 6 and len(set(frames)) == 6 and widget.play.value == 0
    assert [re.search(r'<svg[^>]* data-step="(\d+)"', f).group(1) for f in frames] == [str(i) for i in range(6)]
    assert widget.slider.options[0] == "0.0 – 2000.0 ms" and widget.slider.options[-1] == "8000.0 – 10000.0 ms"
    assert widget.still_html() == frames[3]  # a page without widgets: the middle
    assert 'class="rank-lanes"' in widget._repr_mimebundle_()["text/html"]
    assert "0.0 – 2000.0 ms of a 10000.0 ms run" in frames[0]
    assert ">1000 ms<" in frames[0] and ">3000 ms<" not in frames[0]  # the axis: the window's ticks
    for kind in ("compute", "all-reduce", "gather"):
        assert f'fill="{COLOURS[kind]}"' in frames[0]
    assert ">all-reduce (sum over ranks)<" in frames[0] and ">idle<" in frames[0] and ">prefill<" not in frames[0]
    # frames a sliver apart get labels with the decimals that keep them apart
    assert len(set(frame_labels([1.0, 1.00001, 1.00002], 1.0))) == 3
    assert len(RankLanes(lanes_from_collectives(RECORDS), window=9.999, max_frames=5).slider.options) == 3


def _disaggregated():
    lanes = [Lane("router", [LaneSpan("route", 0.0, 0.0002)]),
             Lane("prefill worker", [LaneSpan("prefill", 0.0, 0.004), LaneSpan("send KV", 0.004, 0.0045)]),
             Lane("decode worker", [LaneSpan("decode", 0.0, 0.003), LaneSpan("receive KV", 0.005, 0.006),
                                    LaneSpan("decode", 0.006, 0.009)])]
    return lanes, [Transfer("prefill worker", "decode worker", 0.0042, 0.006, "req 3: 12 blocks, 96 KiB")]


def test_a_transfer_is_an_arrow_from_the_sender_to_the_receiver_with_its_label():
    lanes, transfers = _disaggregated()
    svg = render_frame(lanes, transfers, 0.009, 0.009)
    assert ">req 3: 12 blocks, 96 KiB<" in svg and svg.count('class="arrow-head"') == 1
    line = re.search(r'<g class="transfer"><title>req 3: 12 blocks, 96 KiB \(1.800 ms\)</title><line x1="([\d.]+)" '
                     r'y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)"', svg)
    x1, y1, x2, y2 = map(float, line.groups())
    assert x1 == pytest.approx(LEFT + PLOT_W * 0.0042 / 0.009, abs=0.1)  # leaves when the send began
    assert x2 == pytest.approx(LEFT + PLOT_W * 0.006 / 0.009, abs=0.1)  # arrives when the receipt ended
    assert y1 < y2  # downwards, from the prefill lane's bottom to the decode lane's top
    assert ">route<" in svg and ">router<" in svg  # a kind without a colour of its own: in the legend, grey
    assert ">prefill worker<" in svg and ">receive KV<" in svg and ">prefill 44% · send KV 6% · idle 50%<" in svg
    # the window [5, 9] ms cuts the arrow at its left edge; [0, 5] ms cuts off its head
    late, early = render_frame(lanes, transfers, 0.009, 0.004), render_frame(lanes, transfers, 0.005, 0.005)
    assert float(re.search(r'<line x1="([\d.]+)" y1="[\d.]+" x2="[\d.]+" y2="[\d.]+" stroke="#333"', late).group(1)) \
        == pytest.approx(LEFT, abs=0.1)
    assert 'class="arrow-head"' in late and 'class="arrow-head"' not in early and 'class="transfer"' in early
    assert 'class="transfer"' not in render_frame(lanes, transfers, 0.004, 0.004)  # before it left
    # upwards works too
    back = render_frame(lanes, [Transfer("decode worker", "prefill worker", 0.001, 0.002, "ack")], 0.009, 0.009)
    y1, y2 = map(float, re.search(r'<line x1="[\d.]+" y1="([\d.]+)" x2="[\d.]+" y2="([\d.]+)" stroke="#333"',
                                  back).groups())
    assert y1 > y2 and ">ack<" in back
    for bad in (Transfer("prefill worker", "nowhere", 0, 1, "x"), Transfer("router", "router", 0, 1, "x")):
        with pytest.raises(ValueError, match="between two of the lanes"):
            render_frame(lanes, [bad], 0.009, 0.009)


def test_labels_do_not_overlap_however_crowded():
    rng = random.Random(0)
    lanes, _ = _disaggregated()
    lanes.append(Lane("a lane with a name far too long for the column", [LaneSpan("decode", 0.0, 0.009)]))
    lanes[1].spans += [LaneSpan(k, 0.001 * i, 0.001 * i + 0.0004) for i, k in enumerate(["weird kind"] * 3 + [
        "other"] * 3)]
    transfers = [Transfer("prefill worker", rng.choice(["decode worker", "router", lanes[3].name]),
                          t, t + rng.uniform(0, 0.002), f"req {i}: {rng.randint(1, 99)} blocks, 96 KiB")
                 for i, t in enumerate(sorted(rng.uniform(0, 0.009) for _ in range(14)))]
    for t_end, window in ((0.009, 0.009), (0.005, 0.003), (0.011, 0.004)):
        svg = render_frame(lanes, transfers, t_end, window)
        assert_no_label_overlaps(svg)
        drawn = re.findall(r'<g class="transfer"><title>([^<]*) \(', svg)
        shown = [words for *_, words in _texts(svg) if words.startswith("req ")]
        assert drawn and shown and set(shown) <= set(drawn)  # a label without room: the arrow's hover title
    svg = render_frame(lanes, transfers, 0.009, 0.009)
    assert ">a lane with a na…<" in svg and "<title>a lane with a name far too long for the column</title>" in svg
    tp = RankLanes(lanes_from_collectives({r: RECORDS[r % 2] for r in range(8)}), window=3.0)
    for frame in tp.stacks[0].children:
        assert_no_label_overlaps(frame.value)
    for window in (0.00002, 0.3, 70.0):  # ticks: at most ten, none touching
        assert_no_label_overlaps(render_frame(lanes_from_collectives(RECORDS), [], 10.0, window))


def test_nothing_recorded_says_so():
    for lanes in ([], [Lane("rank 0 (engine)"), Lane("rank 1")], lanes_from_collectives({0: [], 1: []})):
        svg = render_frame(lanes, [], 1.0, 1.0)
        assert "nothing recorded" in svg and 'data-step="0"' in svg
        widget = RankLanes(lanes)
        assert len(widget.slider.options) == 1 and "nothing recorded" in widget.still_html()
    assert "rank 1" in render_frame(lanes_from_collectives({0: [], 1: []}), [], 1.0, 1.0)
    assert lanes_from_collectives({}) == [] and shares([]) == {} and shares([Lane("x")]) == {"x": {}}
    # a rank that recorded nothing beside one that did: a lane all idle
    assert shares(lanes_from_collectives({0: RECORDS[0], 1: []}))["rank 1"] == {"idle": 1.0}
    with pytest.raises(ValueError, match="window"):
        render_frame(lanes_from_collectives(RECORDS), [], 1.0, 0.0)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def test_a_real_two_rank_run_has_compute_and_all_reduces_on_both_ranks(tmp_path):
    make_checkpoint("qwen3", tmp_path, seed=7)
    model = load_model(tmp_path)
    before = _children()
    engine = LLMEngine(model, None, EngineConfig(tensor_parallel_size=2, kv="paged"), detokenize=False)
    try:
        engine.add_request([1, 2, 3, 4], SamplingParams(temperature=0, max_new_tokens=5), request_id="a")
        while engine.has_unfinished():
            engine.step()
        engine.release("a")
        records = engine.workers.drain()
    finally:
        engine.close()
    assert sorted(records) == [0, 1]
    lanes = lanes_from_collectives(records)
    assert [lane.name for lane in lanes] == ["rank 0 (engine)", "rank 1"]
    for name, share in shares(lanes).items():
        assert share.get("compute", 0) > 0 and share.get("all-reduce", 0) > 0 and share.get("gather", 0) > 0, name
        assert sum(share.values()) == pytest.approx(1)
    counts = [[sum(c.kind == kind for c in records[r]) for kind in ("step", "all-reduce", "gather")] for r in (0, 1)]
    assert counts[0] == counts[1] and counts[0][0] == 5  # one step per token; the ranks met in every collective
    widget = RankLanes(lanes)
    assert all(">rank 1<" in f.value and "compute" in f.value for f in widget.stacks[0].children)
    assert_no_label_overlaps(widget.still_html())
    gc.collect()
    deadline = time.monotonic() + 10
    while (left := _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"worker processes left behind: {left}"
