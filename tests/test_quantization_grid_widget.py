"""widgets/quantization_grid.py: a frame shows a row's weights against the levels its scheme allows and every
scheme's error against bytes; frames are pure and escaped, and the widget plays them without a kernel."""

from __future__ import annotations

import re

import pytest
import torch

from experiments import ch12
from widgets.quantization_grid import QuantizationGrid, render_frame, still_index


@pytest.fixture(scope="module")
def frames():
    weight = torch.randn(16, 128, generator=torch.Generator().manual_seed(0)) * 0.05
    return ch12.grid_frames(weight, 3, ch12.chapter_schemes())


def test_a_frame_names_its_scheme_its_bytes_and_its_error(frames):
    frame = render_frame(frames, 8, "demo <layer>")
    assert frame.startswith("<svg") and 'class="quantization-grid"' in frame and 'data-step="8"' in frame
    assert "demo &lt;layer&gt; · int4 groups of 64, asymmetric · 0.625 bytes per weight" in frame
    assert f"error {frames[8].error:.1%} of the weights" in frame
    assert "the 16 values each group&#x27;s scale allows" in frame
    assert frame.count('stroke-dasharray="4 3"') == 1  # one new group starts inside 128 weights of groups of 64


def test_every_weight_is_drawn_with_its_codes_value(frames):
    frame = render_frame(frames, 0)
    assert frame.count("<circle") == 128 + len(frames)  # the row's weights, then one point per scheme
    assert frame.count("<rect") == 128 + 2  # a code mark per weight, and the two panels
    assert "the 255 values its scale allows" in frame  # int8 per tensor


def test_the_scatter_puts_this_scheme_in_red_and_the_rest_as_points(frames):
    frame = render_frame(frames, 5)
    assert frame.count('r="5.5" fill="#d62728"') == 1
    titles = re.findall(r"<title>([^<]*)</title>", frame)
    assert len(titles) == len(frames) - 1 and not any(t.startswith(frames[5].label + ":") for t in titles)


def test_frames_are_pure_and_the_widget_plays_them(frames):
    assert render_frame(frames, 3) == render_frame(frames, 3)
    widget = QuantizationGrid(frames, "demo")
    assert len(widget.stacks[0].children) == len(frames) == len(widget.slider.options)
    assert widget.slider.options[0] == "int8 · per tensor"
    assert widget.slider.options[-1] == "int3 · groups of 32 (asym.)"
    assert frames[still_index(frames)].label == "int4 groups of 64, asymmetric"  # the first with two groups shown
    with pytest.raises(ValueError):
        render_frame([], 0)


def test_more_bits_and_smaller_runs_give_less_error_on_real_weights():
    """The chapter's claim on the shipped model's weights: within a bit width, each finer scale helps."""
    import minillm

    weight = minillm.load_model().layers[3].mlp.down_proj.weight
    grid = {e.scheme.label: e.error for e in ch12.error_grid(weight, ch12.chapter_schemes())}
    for bits in (8, 4, 3):
        ladder = [grid[f"int{bits} per tensor"], grid[f"int{bits} per channel"]] + \
                 [grid[f"int{bits} groups of {g}, asymmetric"] for g in (128, 64, 32)]
        assert ladder == sorted(ladder, reverse=True), (bits, ladder)
    assert grid["int8 per channel"] < grid["int4 groups of 32, asymmetric"] < grid["int3 groups of 32, asymmetric"]
    outlier = ch12.with_outlier(weight, 5, 7)
    tensor, channel = (ch12.relative_error(outlier, ch12.quantize(outlier, ch12.Scheme(8, g))) for g in
                       ("tensor", "channel"))
    assert tensor > 10 * channel


def test_the_roofline_says_which_resource_bounds_a_decode_step():
    h200 = ch12.DEVICES[1]
    small = ch12.decode_roofline(8e9, 2, 1, 1000, 131072, h200)
    assert small["bound"] == "memory" and small["bytes"] == 8e9 * 2 + 1000 * 131072
    int4 = ch12.decode_roofline(8e9, 0.5625, 1, 1000, 131072, h200)
    assert int4["step_s"] < small["step_s"] / 3
    huge_batch = ch12.decode_roofline(8e9, 0.5625, 4096, 0, 0, h200)
    assert huge_batch["bound"] == "compute"
