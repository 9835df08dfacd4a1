"""widgets/rank_lanes.py: compute, collectives and idle split exactly; frames that move; transfers drawn as
labelled arrows; a real two-rank run's records replayed."""

from __future__ import annotations

import re

import pytest

from minillm.distributed.communicator import Collective
from widgets.rank_lanes import Lane, LaneSpan, RankLanes, Transfer, lanes_from_collectives, render_frame, shares

RECORDS = {
    0: [Collective("step", 0.0, 10.0, 0), Collective("all-reduce", 2.0, 3.0, 1024),
        Collective("all-reduce", 6.0, 8.0, 1024), Collective("gather", 9.0, 10.0, 512)],
    1: [Collective("step", 1.0, 10.0, 0), Collective("all-reduce", 2.5, 3.0, 1024),
        Collective("all-reduce", 7.0, 8.0, 1024), Collective("gather", 9.5, 10.0, 512)],
}


def test_a_step_outside_its_collectives_is_compute_and_outside_any_step_idle():
    lanes = lanes_from_collectives(RECORDS)
    assert [lane.name for lane in lanes] == ["rank 0 (engine)", "rank 1"]
    compute = [(s.start, s.end) for s in lanes[0].spans if s.kind == "compute"]
    assert compute == [(0.0, 2.0), (3.0, 6.0), (8.0, 9.0)]
    share = shares(lanes)
    assert share["rank 0 (engine)"] == pytest.approx({"compute": 0.6, "all-reduce": 0.3, "gather": 0.1})
    # rank 1 started its step 1 s late (idle), and its collectives were shorter: it arrived last, waited less
    assert share["rank 1"] == pytest.approx({"idle": 0.1, "compute": 0.7, "all-reduce": 0.15, "gather": 0.05})


def test_frames_slide_and_say_which_frame_they_are():
    widget = RankLanes(lanes_from_collectives(RECORDS), window=2.0, max_frames=6)
    frames = [w.value for w in widget.stacks[0].children]
    assert len(frames) == 6 and len(set(frames)) == 6
    assert [re.search(r'data-step="(\d+)"', f).group(1) for f in frames] == [str(i) for i in range(6)]
    assert "compute" in frames[0] and "all-reduce" in frames[0]


def test_a_transfer_is_an_arrow_with_its_label():
    lanes = [Lane("prefill worker", [LaneSpan("prefill", 0.0, 0.004), LaneSpan("send KV", 0.004, 0.0045)]),
             Lane("decode worker", [LaneSpan("decode", 0.0, 0.003), LaneSpan("receive KV", 0.005, 0.006),
                                    LaneSpan("decode", 0.006, 0.009)])]
    svg = render_frame(lanes, [Transfer("prefill worker", "decode worker", 0.0042, 0.006, "12 blocks, 96 KiB")],
                       0.009, 0.009)
    assert "marker-end" in svg and "12 blocks, 96 KiB" in svg
    assert "prefill worker" in svg and "receive KV" in svg


def test_nothing_recorded_says_so():
    assert "nothing recorded" in render_frame([Lane("rank 0 (engine)")], [], 1.0, 1.0)
    RankLanes([Lane("rank 0 (engine)")])  # builds, one frame


def test_a_real_two_rank_run_has_compute_and_all_reduces_on_both_ranks(model):
    from experiments import ch13

    (run,) = ch13.tp_runs(model, [[1, 2, 3, 4], [5, 6]], 5, sizes=(2,), max_num_seqs=2, max_model_len=64)
    lanes = lanes_from_collectives(run.records)
    assert len(lanes) == 2
    for name, share in shares(lanes).items():
        assert share.get("compute", 0) > 0 and share.get("all-reduce", 0) > 0, name
    RankLanes(lanes)
