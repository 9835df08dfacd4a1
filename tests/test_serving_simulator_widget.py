"""widgets/serving_simulator.py: the sliders re-run the real scheduler in the simulator, and the
picture shows what it returned: throughput saturates and the tail grows as the rate passes capacity."""

from minillm.sim import StepTimeModel
from widgets.serving_simulator import SWEEP, ServingSimulator, render, run_point, workload

STEP = StepTimeModel(base=0.004, per_sequence=0.0003, per_prompt_token=0.00002, per_context_token=0.0)


def test_the_workload_is_seeded_and_poisson():
    a, b = workload(10.0, 400, 100, 50, 0.5, seed=1), workload(10.0, 400, 100, 50, 0.5, seed=1)
    assert a == b and a[0].arrival == 0.0 and 30 < a[-1].arrival < 50  # ~400 / 10 s
    assert all(50 <= r.prompt_len <= 150 and 25 <= r.output_len <= 75 for r in a)
    assert 0.35 < sum(r.shared_prefix_len > 0 for r in a) / len(a) < 0.65


def test_throughput_saturates_and_the_tail_grows_past_capacity():
    light, heavy = (run_point(STEP, rate, 8, 1024, 100, 64, 0, 0.0) for rate in (2.0, 200.0))
    assert light["ttft_p99_s"] < 0.1 < heavy["ttft_p99_s"]
    assert heavy["output_token_throughput"] > light["output_token_throughput"]
    assert max(w for _, w, _ in heavy["queue"]) > 50 and max(r for _, _, r in heavy["queue"]) == 8  # every slot busy


def test_the_widget_redraws_from_its_sliders():
    widget = ServingSimulator(STEP, rate=4.0)
    first = widget.picture.value
    assert 'data-step="4.000"' in first and first.count("<circle") == len(SWEEP)
    assert "At 4 requests/s" in widget.readout.value
    widget.sliders["max_num_seqs"].value = 2
    assert widget.picture.value != first and 'data-step="4.000"' in widget.picture.value
    points = [run_point(STEP, r, 4, 512, 50, 20, 16, 0.2, count=40) for r in (1.0, 2.0)]
    svg = render(points, points[1])
    assert svg.count('fill="#d62728"') == 1 and "waiting" in svg and "running" in svg
