"""widgets/serving_simulator.py: the sliders re-run the real scheduler in the simulator, and the
picture shows what it returned: throughput saturates and the tail grows as the rate passes capacity."""

import pytest

from minillm.sim import StepTimeModel
from widgets.serving_simulator import (
    SPREADS,
    SWEEP,
    ServingSimulator,
    average_queue,
    capacity,
    nice_ticks,
    readout,
    render,
    run_point,
    workload,
)

STEP = StepTimeModel(base=0.004, per_sequence=0.0003, per_prompt_token=0.00002, per_context_token=0.0)


def test_the_workload_is_seeded_and_poisson():
    a, b = workload(10.0, 400, 100, 50, 0.5, seed=1), workload(10.0, 400, 100, 50, 0.5, seed=1)
    assert a == b and a[0].arrival == 0.0 and 30 < a[-1].arrival < 50  # ~400 / 10 s
    assert all(50 <= r.prompt_len <= 150 and 25 <= r.output_len <= 75 for r in a)
    assert 0.35 < sum(r.shared_prefix_len > 0 for r in a) / len(a) < 0.65


def test_the_length_spreads():
    fixed, uniform, tail = (workload(10.0, 2000, 100, 50, 0.0, spread=s) for s in ("fixed", SPREADS[0], "long-tailed"))
    assert {r.prompt_len for r in fixed} == {100} and {r.output_len for r in fixed} == {50}
    assert min(r.prompt_len for r in uniform) >= 50 and max(r.prompt_len for r in uniform) <= 150
    tail_prompts = sorted(r.prompt_len for r in tail)
    assert tail_prompts[len(tail) // 2] < 80 and tail_prompts[-1] == 400  # mostly short, a few capped at 4x
    with pytest.raises(ValueError, match="spread"):
        workload(10.0, 10, 100, 50, 0.0, spread="gaussian")


def test_speculation_shortens_the_time_per_token():
    plain, guessing = (run_point(STEP, 2.0, 8, 1024, 100, 64, 0, 0.0, guesses=g, acceptance=0.8) for g in (0, 4))
    assert guessing["tpot_p50_s"] < plain["tpot_p50_s"] and guessing["requests"] == plain["requests"]


def test_throughput_saturates_and_the_tail_grows_past_capacity():
    light, heavy = (run_point(STEP, rate, 8, 1024, 100, 64, 0, 0.0) for rate in (2.0, 200.0))
    assert light["ttft_p99_s"] < 0.1 < heavy["ttft_p99_s"]
    assert heavy["output_token_throughput"] > light["output_token_throughput"]
    assert max(w for _, w, _ in heavy["queue"]) > 50 and max(r for _, _, r in heavy["queue"]) == 8  # every slot busy


def test_the_widget_redraws_from_its_sliders():
    widget = ServingSimulator(STEP, rate=4.0, background=False)
    first = widget.picture.value
    assert 'data-step="4.000"' in first and first.count("<circle") == len(SWEEP)
    assert "At 4 requests/s" in widget.readout.value
    widget.sliders["max_num_seqs"].value = 2
    assert widget.picture.value != first and 'data-step="4.000"' in widget.picture.value
    for name, value in (("guesses", 4), ("acceptance", 0.2), ("spread", "long-tailed")):
        before = widget.picture.value
        widget.sliders[name].value = value
        assert widget.picture.value != before
    points = [run_point(STEP, r, 4, 512, 50, 20, 16, 0.2, count=40) for r in (1.0, 2.0)]
    svg = render(points, points[1])
    assert svg.count('fill="#d62728"') == 1 and "waiting" in svg and "running" in svg


def test_a_redraw_in_progress_is_shown_and_rapid_changes_are_coalesced():
    widget = ServingSimulator(STEP, rate=4.0, output_len=20)  # short answers: each point is quick
    words = widget.readout.value
    assert widget.simulated == 1 and "capacity()" in words and widget.status.value == ""
    for slots in (2, 3, 5, 6):  # four quick presses
        widget.sliders["max_num_seqs"].value = slots
        assert "simulating" in widget.status.value and "opacity" in widget.picture.value + widget.readout.value
    widget.settle()
    assert widget._worker is None and widget.status.value == "" and "opacity" not in widget.picture.value
    assert 2 <= widget.simulated <= 4  # the latest settings drawn, at least one overtaken run skipped
    still = ServingSimulator(STEP, rate=4.0, output_len=20, max_num_seqs=6, background=False)
    assert widget.picture.value == still.picture.value and widget.readout.value == still.readout.value != words


def test_the_capacity_is_what_a_full_batch_finishes():
    full = run_point(STEP, 200.0, 8, 4096, 100, 64, 0, 0.0)  # far past capacity: every slot busy
    assert abs(full["request_throughput"] / capacity(STEP, 8, 100, 64) - 1) < 0.15


def test_ticks_are_round_and_cover_the_data():
    assert nice_ticks(1090.0) == [0, 500, 1000, 1500] and nice_ticks(4.21) == [0, 2, 4, 6]
    assert nice_ticks(0.5) == [0.0, 0.2, 0.4, 0.6] and nice_ticks(17.0) == [0, 5, 10, 15, 20]
    for top in (0.003, 0.5, 4.21, 17.0, 1090.0, 3e6):
        ticks = nice_ticks(top)
        assert ticks[0] == 0 and ticks[-1] >= top and 3 <= len(ticks) <= 6
    assert nice_ticks(0.0) == [0.0, 1.0] and nice_ticks(float("nan")) == [0.0, 1.0]


def test_the_queue_is_averaged_over_time():
    queue = [(0.0, 0, 0), (1.0, 4, 2), (3.0, 0, 2), (4.0, 0, 0)]  # each state holds until the next step
    assert average_queue(queue, 2) == [(1.0, 2.0, 1.0), (3.0, 2.0, 2.0)]
    assert average_queue([], 10) == []


def test_requests_that_can_never_fit_are_said_and_nothing_is_nan():
    impossible = run_point(STEP, 4.0, 16, 16, 1024, 64, 0, 0.0, count=20)  # 16 blocks = 256 tokens
    assert impossible["refused"] == 20 and impossible["requests"] == 0
    text = readout(impossible, 16)
    assert "20 of 20 requests can never fit in 16 KV blocks (256 tokens)" in text and "nan" not in text
    svg = render([impossible], impossible)
    assert "nan" not in svg and "no request completed" in svg
    some = run_point(STEP, 4.0, 16, 64, 1024, 64, 0, 0.0, count=50)
    assert 0 < some["refused"] < 50 and f"{some['refused']} of 50 requests" in readout(some, 64)
    one_token = run_point(STEP, 4.0, 16, 512, 50, 1, 0, 0.0, count=20)
    assert "nan" not in readout(one_token, 512) and "TPOT p50 —" in readout(one_token, 512)
