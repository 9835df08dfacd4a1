"""ch12's graders, proven both ways: each passes the solution and a correct answer that orders its float
operations differently, reports the untouched stub as "not started", and rejects every wrong answer of
wrong_answers.py naming its rule. The graders' references are the engine's formats (minillm/quantization/
formats.py) on the shipped model's weights, and the FAIL lines say which case, what was expected and what came."""

from __future__ import annotations

import pytest
import torch

from exercises.grading import EXERCISES, load, run
from exercises.grading.ch12 import (
    THREE,
    reference_groups,
    reference_per_channel,
    shipped_weight,
    step_times,
    with_outlier,
)
from minillm.quantization.formats import quantize_int4, quantize_int8, quantize_per_tensor_int8
from solutions.ch12_fastest_scheme import step_ms
from solutions.ch12_quantize_groups import dequantize_groups, quantize_groups
from solutions.ch12_quantize_per_channel import dequantize_per_channel, quantize_per_channel
from tests.exercises.wrong_answers import (
    WRONG,
    fastest_scheme_adds_reading_and_computing,
    quantize_groups_strided,
    quantize_per_channel_per_input_column,
    quantize_per_channel_per_tensor,
    quantize_per_channel_without_clamping,
)

NAMES = [name for name in EXERCISES if name.startswith("ch12.")]
CH12_WRONG = [w for w in WRONG if w[0].startswith("ch12.")]
SHIPPED = ("layers.3.mlp.down_proj.weight", "layers.0.self_attn.qkv_proj.weight", "layers.6.self_attn.o_proj.weight")


def _failed(name, impl) -> list[str]:
    return [r.line() for r in run(name, impl) if not r.passed]


def test_chapter_12_has_its_five_exercises():
    assert NAMES == ["ch12.quantize_int8", "ch12.dequantize_int8", "ch12.quantize_int4", "ch12.dequantize_int4",
                     "ch12.fastest_scheme"]
    assert {EXERCISES[name].chapter for name in NAMES} == {"ch12"}


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_passes_and_the_stub_is_not_started(name):
    assert not _failed(name, load(name, "solutions"))
    assert all(r.status == "not started" for r in run(name, load(name, "exercises")))


@pytest.mark.parametrize(("name", "impl", "rule"), CH12_WRONG, ids=[f"{n}-{i.__name__}" for n, i, _ in CH12_WRONG])
def test_every_wrong_answer_fails_naming_its_rule(name, impl, rule):
    failures = _failed(name, impl)
    assert any(rule in line for line in failures), "\n".join(failures)
    assert all(" expected " in line and ", got " in line for line in failures), "\n".join(failures)


def test_the_wrong_answers_the_issue_names_are_all_there():
    names = {impl.__name__ for _, impl, _ in CH12_WRONG}
    assert {"quantize_per_channel_per_tensor", "quantize_per_channel_per_input_column",
            "quantize_per_channel_without_clamping", "quantize_per_channel_toward_zero", "quantize_groups_strided",
            "quantize_groups_along_the_outputs", "quantize_groups_symmetric", "quantize_groups_forgetting_the_minimum",
            "quantize_groups_toward_zero", "dequantize_groups_forgetting_the_minimum"} <= names
    assert all(sum(n == name for n, _, _ in CH12_WRONG) >= 2 for name in NAMES)


# ----------------------------------------------------------------------------- the references are the engine's


@pytest.mark.parametrize("name", SHIPPED)
def test_the_int8_reference_is_the_engines_format(name):
    weight = shipped_weight(name)
    codes, scale = reference_per_channel(weight)
    engine = quantize_int8(weight)
    assert torch.equal(codes, engine.q) and torch.equal(scale, engine.scale)
    assert torch.equal(dequantize_per_channel(codes, scale), engine.dequantize())


@pytest.mark.parametrize(("name", "group_size"), [(SHIPPED[0], 32), (SHIPPED[0], 128), (SHIPPED[1], 64),
                                                  (SHIPPED[2], 32)])
def test_the_int4_reference_is_the_engines_format(name, group_size):
    weight = shipped_weight(name)
    codes, scale, minimum = reference_groups(weight, group_size)
    engine = quantize_int4(weight, group_size)
    assert torch.equal(codes, engine.q) and torch.equal(scale, engine.scale) and torch.equal(minimum, engine.minimum)
    assert torch.allclose(dequantize_groups(codes, scale, minimum), engine.dequantize(), rtol=0, atol=1e-7)


def test_the_solutions_round_trip_within_half_a_step():
    weight = shipped_weight(SHIPPED[0])
    codes, scale = quantize_per_channel(weight)
    assert ((dequantize_per_channel(codes, scale) - weight).abs() <= scale[:, None] / 2 + 1e-7).all()
    codes, scale, minimum = quantize_groups(weight, 64)
    error = (dequantize_groups(codes, scale, minimum) - weight).abs()
    assert (error <= scale.repeat_interleave(64, dim=1) / 2 + 1e-7).all()


def test_the_outlier_matrix_is_what_per_tensor_ruins():
    """The graders' outlier (40x the largest weight) makes one scale for the tensor lose nearly all precision,
    while a scale per row keeps every other row as it was."""
    weight = shipped_weight(SHIPPED[0])
    spoilt = with_outlier(weight, 5, 300)
    per_tensor = (quantize_per_tensor_int8(spoilt) - spoilt).abs()
    per_row = (quantize_int8(spoilt).dequantize() - spoilt).abs()
    others = torch.ones(spoilt.shape[0], dtype=torch.bool)
    others[5] = False
    assert per_tensor[others].mean() > 20 * per_row[others].mean()
    assert torch.equal(quantize_int8(spoilt).q[others], quantize_int8(weight).q[others])


# ----------------------------------------------------------------------------- correct answers in another order


def quantize_per_channel_multiplying(weight, clip=1.0):
    """Correct, in float64 and with a multiplication: codes a hair from a half may round the other way."""
    w = weight.double()
    largest = w.abs().amax(dim=1)
    scale = torch.where(largest > 0, largest * clip / 127, torch.ones_like(largest))
    codes = torch.round(w * (1 / scale)[:, None]).clamp(-127, 127)
    return codes.to(torch.int8), scale.float()


def quantize_groups_multiplying(weight, group_size):
    n, k = weight.shape
    w = weight.double().view(n, k // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = torch.where(high > low, (high - low) / 15, torch.ones_like(low))
    codes = torch.round((w - low[..., None]) * (1 / scale)[..., None]).clamp(0, 15)
    return codes.view(n, k).to(torch.uint8), scale.float(), low.float()


def test_a_correct_answer_in_another_float_order_passes():
    assert not _failed("ch12.quantize_int8", quantize_per_channel_multiplying)
    assert not _failed("ch12.quantize_int4", quantize_groups_multiplying)
    # ...and it does round some codes of the shipped weights the other way: the tolerance is needed
    weight = shipped_weight(SHIPPED[0])
    assert not torch.equal(quantize_per_channel_multiplying(weight, 0.7)[0], reference_per_channel(weight, 0.7)[0])


# ----------------------------------------------------------------------------- what the FAIL lines say


def test_a_per_tensor_scale_is_reported_with_the_row_and_its_own_largest_weight():
    line = next(line for line in _failed("ch12.quantize_int8", quantize_per_channel_per_tensor)
                if line.startswith("FAIL  One scale per output row"))
    assert "expected scale[0] = " in line and "max|w[0, :]| / 127" in line and "its own row's largest" in line
    assert "other scale values differ too" in line


def test_a_scale_per_input_column_is_named_as_such():
    failures = _failed("ch12.quantize_int8", quantize_per_channel_per_input_column)
    assert any("scale: a float32 tensor of shape (256,) (one per output row: this is one per input column), got "
               "scale: a float32 tensor of shape (768,)" in line for line in failures), "\n".join(failures)


def test_a_missing_clamp_is_reported_with_the_wrapped_code():
    line = next(line for line in _failed("ch12.quantize_int8", quantize_per_channel_without_clamping)
                if "clamped to ±127" in line.split(":")[0])
    assert "clip=0.5" in line and "expected codes[0, 0] = 127" in line and "wraps around" in line
    assert ", got -2 " in line  # 254 as int8


def test_strided_groups_name_the_columns_of_the_group():
    line = next(line for line in _failed("ch12.quantize_int4", quantize_groups_strided)
                if line.startswith("FAIL  Group g of row n"))
    assert "expected minimum[0, 0] = 0 (the smallest of w[0, 0:4], group 0 of row 0;" in line


def test_a_summed_roofline_shows_every_schemes_step_time_and_bound():
    line = next(line for line in _failed("ch12.fastest_scheme", fastest_scheme_adds_reading_and_computing)
                if line.startswith("FAIL  The step takes the slower"))
    assert "expected 'int8'" in line and "int4 g128" in line and "(FLOPs)" in line and "(bytes)" in line
    assert line.endswith("got 'int4 g128'")


def test_the_contracts_examples():
    """The numbers the exercises' docstrings quote."""
    codes, scale = quantize_per_channel(torch.tensor([[0.5, -1.27, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0],
                                                      [127.0, 2.5, -2.7, 3.5]]))
    assert codes.tolist() == [[50, -127, 30, 0], [0, 0, 0, 0], [127, 2, -3, 4]]
    assert torch.allclose(scale, torch.tensor([0.01, 1.0, 1.0]))
    codes, scale = quantize_per_channel(torch.tensor([[0.5, -1.27, 0.3, 0.0], [127.0, 2.5, -2.7, 3.5]]), clip=0.5)
    assert codes[1].tolist() == [127, 5, -5, 7] and torch.allclose(scale, torch.tensor([0.005, 0.5]))
    codes, scale, minimum = quantize_groups(torch.tensor([[0.0, 1.5, 3.0, 7.5, -1.0, -1.0, -1.0, -1.0],
                                                          [2.0, 3.5, 5.0, 17.0, 0.0, 15.0, 6.5, 7.5]]), 4)
    assert codes.tolist() == [[0, 3, 6, 15, 0, 0, 0, 0], [0, 2, 3, 15, 0, 15, 6, 8]]
    assert scale.tolist() == [[0.5, 1.0], [1.0, 1.0]] and minimum.tolist() == [[0.0, -1.0], [2.0, 0.0]]
    model = {"num_weights": 8e9, "kv_bytes_per_token": 131072, "bandwidth_gb_s": 3350, "tflops": 990}
    assert [round(step_ms(s, context_lengths=[2000], **model), 3) for s in THREE.values()] == [4.854, 2.466, 1.347]
    assert [round(step_ms(s, context_lengths=[100] * 512, **model), 3) for s in THREE.values()] == \
        [8.275, 12.412, 16.549]
    assert [bound for _, bound in step_times(THREE, context_lengths=[100] * 512, **model).values()] == ["FLOPs"] * 3


def test_the_quiz_explains_every_option():
    from widgets.quiz import Question, load_questions, render_quiz

    questions = load_questions("ch12")
    assert len(questions) == 6 and all(isinstance(q, Question) for q in questions)
    assert all(len(q.why_not) == len(q.options) and q.why_not[q.answer] is None and
               all(text for i, text in enumerate(q.why_not) if i != q.answer) for q in questions)
    assert render_quiz(questions).count("data-correct='true'") == 6
