"""Chapter 12's cases: `ch12.quantize_int8` / `ch12.dequantize_int8` (symmetric int8, one scale
per output row), `ch12.quantize_int4` / `ch12.dequantize_int4` (asymmetric 4-bit codes, a scale and a
minimum per group of consecutive inputs) and `ch12.fastest_scheme` (which weight format gives the fastest
decode step, by the roofline).

The codes are compared with the reference below, which is the engine's (minillm/quantization/formats.py;
tests/exercises/test_ch12_graders.py checks that they agree). A code may be one off where what is rounded
lies within a hair of a half without being exactly one: the order of the float operations (w / scale, or
w * (127 / max)) decides those, and either order is right. Exact halves (scale 1, w = 2.5) are graded."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import torch

from exercises.grading.core import call, exercise, expect, fail, listed

quantize_per_channel = exercise("ch12.quantize_int8", "ch12_quantize_per_channel", "quantize_per_channel")
dequantize_per_channel = exercise("ch12.dequantize_int8", "ch12_quantize_per_channel", "dequantize_per_channel")
quantize_groups = exercise("ch12.quantize_int4", "ch12_quantize_groups", "quantize_groups")
dequantize_groups = exercise("ch12.dequantize_int4", "ch12_quantize_groups", "dequantize_groups")
fastest_scheme = exercise("ch12.fastest_scheme", "ch12_fastest_scheme", "fastest_scheme")

NEAR_HALF = 1e-3  # a code may be one off where what is rounded is this close to a half (not exactly one)


# ----------------------------------------------------------------------------------------- references


def reference_per_channel(weight: torch.Tensor, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 (N, K), scale float32 (N,)): symmetric, one scale per output row."""
    w = weight.detach().float()
    largest = w.abs().amax(dim=1)
    scale = torch.where(largest > 0, clip * largest / 127, torch.ones_like(largest))
    return torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8), scale


def reference_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 (N, K), scale (N, K/G), minimum (N, K/G)): asymmetric over each group's [min, max]."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = torch.where(high > low, (high - low) / 15, torch.ones_like(low))
    codes = torch.clamp(torch.round((w - low[..., None]) / scale[..., None]), 0, 15).to(torch.uint8)
    return codes.reshape(n, k), scale, low


@functools.cache
def _shipped_weights() -> dict[str, torch.Tensor]:
    """A few of the shipped model's weight matrices (loaded once per process)."""
    import minillm

    model = minillm.load_model()
    wanted = ("layers.3.mlp.down_proj.weight", "layers.0.self_attn.qkv_proj.weight", "layers.6.self_attn.o_proj.weight")
    params = dict(model.named_parameters())
    return {name: params[name].detach().float().clone() for name in wanted}


def shipped_weight(name: str) -> torch.Tensor:
    """A fresh copy of one of the shipped model's weights (the learner's code cannot spoil the next case's)."""
    return _shipped_weights()[name].clone()


def with_outlier(weight: torch.Tensor, row: int, column: int, times: float = 40.0) -> torch.Tensor:
    """`weight` with entry [row, column] set to `times` the matrix's largest magnitude: an outlier."""
    out = weight.clone()
    out[row, column] = times * weight.abs().max()
    return out


# ----------------------------------------------------------------------------------------- helpers




def _shown(weight: torch.Tensor) -> str:
    return listed(weight) if weight.numel() <= 40 else f"a {tuple(weight.shape)} matrix"


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    return repr(value) if not isinstance(value, tuple | list) else f"a {type(value).__name__} of {len(value)}"


def _tensors(got: Any, count: int, given: str, expected: str) -> tuple[torch.Tensor, ...]:
    """`got` as `count` tensors, or a FAIL saying what came back instead."""
    if not isinstance(got, tuple | list) or len(got) != count or not all(isinstance(t, torch.Tensor) for t in got):
        shown = _kind(got) if not isinstance(got, tuple | list) else "(" + ", ".join(map(_kind, got)) + ")"
        fail(given, f"a tuple of {count} tensors {expected}", shown)
    return tuple(got)


def _layout(tensor: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype, given: str,
            hint: str = "") -> None:
    want = f"{name}: a {str(dtype).removeprefix('torch.')} tensor of shape {shape}" + (f" ({hint})" if hint else "")
    expect(tuple(tensor.shape) == shape and tensor.dtype == dtype, given, want, f"{name}: {_kind(tensor)}")


def _unchanged(theirs: torch.Tensor, original: torch.Tensor, given: str, name: str = "the weight") -> None:
    expect(torch.equal(theirs, original), f"after {given}", f"{name} unchanged", f"{name} modified in place")


def _scales_match(got: torch.Tensor, want: torch.Tensor, name: str, given: str, explain: Callable[[int], str],
                  why: str) -> None:
    """Every scale (or minimum) within float rounding of the reference's; a FAIL names the first that is not."""
    bad = ~torch.isclose(got.double(), want.double(), rtol=1e-5, atol=1e-12)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        at = ", ".join(map(str, where))
        others = int(bad.sum()) - 1
        more = f" ({others} other {name} value{'s differ' if others > 1 else ' differs'} too)" if others else ""
        fail(given, f"{name}[{at}] = {float(want[where]):.6g} ({explain(*where)}; {why})",
             f"{float(got[where]):.6g}{more}")


def _codes_match(got: torch.Tensor, want: torch.Tensor, ratio: torch.Tensor, given: str,
                 explain: Callable[[int, int], str], why: str) -> None:
    """Every code the reference's. Where `ratio` (what is rounded, in float64) lies within NEAR_HALF of a half
    without being exactly one, one off is fine: the order of the float32 operations decides that code. A FAIL
    names the first code that is wrong and how many are."""
    diff = (got.long() - want.long()).abs()
    frac = ratio.abs() - ratio.abs().floor()
    near_half = ((frac - 0.5).abs() < NEAR_HALF) & (frac != 0.5)
    bad = (diff > 1) | ((diff == 1) & ~near_half)
    if bad.any():
        n, k = (int(i) for i in bad.nonzero()[0])
        others = int(bad.sum()) - 1
        more = f" ({others} of the other {want.numel() - 1} codes {'is' if others == 1 else 'are'} wrong too)"
        fail(given, f"codes[{n}, {k}] = {int(want[n, k])} ({explain(n, k)}; {why})",
             f"{int(got[n, k])}{more if others else ''}")


def _halves(x: float) -> str:
    return "a half: to the even neighbour" if abs(abs(x) % 1 - 0.5) < 1e-9 else "rounded to the nearest"


# ----------------------------------------------------------------------------- quantize per channel


def _per_channel(impl: Callable, weight: torch.Tensor, why: str, clip: float | None = None, name: str | None = None
                 ) -> None:
    n, k = weight.shape
    shown = name or _shown(weight)
    given = f"quantize_per_channel({shown}" + (f", clip={clip}" if clip is not None else "") + ")"
    want_codes, want_scale = reference_per_channel(weight, 1.0 if clip is None else clip)
    mine = weight.clone()
    expected = f"(codes int8 {(n, k)}, scale float32 {(n,)}) ({why})"
    got = call(given, expected, impl, *((mine,) if clip is None else (mine, clip)))
    _unchanged(mine, weight, given)
    codes, scale = _tensors(got, 2, given, expected)
    hint = "one per output row" + (": this is one per input column" if tuple(scale.shape) == (k,) and k != n else "")
    _layout(scale, "scale", (n,), torch.float32, given, hint)
    _layout(codes, "codes", (n, k), torch.int8, given)
    c = 1.0 if clip is None else clip
    w = weight.detach().double()

    def scale_rule(row: int) -> str:
        largest = float(w[row].abs().max())
        if largest == 0:
            return "a row of zeros gets scale 1"
        times = f"{c:g} * " if c != 1 else ""
        return f"{times}max|w[{row}, :]| / 127 = {times}{largest:.6g} / 127" + (
            ", its own row's largest weight only" if float(w.abs().max()) > largest else "")

    _scales_match(scale, want_scale, "scale", given, scale_rule, why)
    ratio = w / want_scale.double()[:, None]

    def code_rule(row: int, col: int) -> str:
        x = float(ratio[row, col])
        if abs(x) > 127.5:
            return (f"w = {float(w[row, col]):.6g}, w / scale = {x:.4g}: past ±127, clamped to {127 if x > 0 else -127}"
                    " — a code past ±127 does not fit int8 and wraps around")
        return f"w = {float(w[row, col]):.6g}, w / scale = {x:.4f}, {_halves(x)}"

    _codes_match(codes, want_codes, ratio, given, code_rule, why)


EXAMPLE = torch.tensor([[0.5, -1.27, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0], [127.0, 2.5, -2.7, 3.5]])


@quantize_per_channel.case
def quantize_per_channel_example(impl: Callable) -> None:
    """The notebook's example: scales [0.01, 1, 1], codes [[50, -127, 30, 0], [0, 0, 0, 0], [127, 2, -3, 4]]"""
    _per_channel(impl, EXAMPLE, "the example of the contract")
    _per_channel(impl, EXAMPLE, "the example of the contract, clipped at half the largest weight", clip=0.5)


@quantize_per_channel.case
def one_scale_per_output_row(impl: Callable) -> None:
    """One scale per output row, scale[n] = max|w[n, :]| / 127: an outlier stretches its own row's scale only"""
    weight = torch.tensor([[0.02, -0.01, 0.03, 0.015, -0.025, 0.005],
                           [0.5, -0.25, 0.125, 0.3, -0.4, 0.2],
                           [0.01, 0.02, 9.0, -0.03, 0.015, -0.005],  # an outlier
                           [-0.002, 0.004, -0.001, 0.003, 0.0005, -0.0035]])
    _per_channel(impl, weight, "four rows of very different ranges; row 2 holds an outlier (9.0): the other rows "
                 "must keep their own fine steps")
    down = shipped_weight("layers.3.mlp.down_proj.weight")
    _per_channel(impl, with_outlier(down, 5, 300), "the shipped model's layers.3.mlp.down_proj.weight with one "
                 "outlier at [5, 300] (40x the largest weight): only row 5's scale grows",
                 name="layers.3.mlp.down_proj.weight with an outlier at [5, 300], (256, 768)")


@quantize_per_channel.case
def codes_round_to_the_nearest_integer(impl: Callable) -> None:
    """Codes are rounded to the nearest integer, not toward zero (w / scale = 2.7 is code 3)"""
    weight = torch.tensor([[127.0, 2.7, -2.7, 0.6, -0.6, 126.9, -99.8, 10.2],
                           [-63.5, 1.1, 30.9, -30.9, 0.49, -0.51, 12.75, 40.0]])
    _per_channel(impl, weight, "row 0 has scale exactly 1 and row 1 exactly 0.5: each code is w / scale rounded to "
                 "the nearest integer")


@quantize_per_channel.case
def halves_round_to_the_even_neighbour(impl: Callable) -> None:
    """A code exactly halfway between two integers goes to the even one, as torch.round does: 2.5 -> 2, 3.5 -> 4"""
    weight = torch.tensor([[127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 126.5]])
    _per_channel(impl, weight, "scale exactly 1: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -3.5 -> -4, ±0.5 -> 0, 126.5 -> 126")


@quantize_per_channel.case
def a_row_of_zeros_gets_scale_one(impl: Callable) -> None:
    """A row of zeros gets scale 1 and codes 0 (max|w| / 127 would be a division by zero)"""
    weight = torch.tensor([[0.0, 0.0, 0.0], [0.3, -0.6, 1.27], [0.0, 0.0, 0.0]])
    _per_channel(impl, weight, "rows 0 and 2 are all zeros")
    down = shipped_weight("layers.3.mlp.down_proj.weight")
    down[17] = 0.0
    _per_channel(impl, down, "the shipped model's layers.3.mlp.down_proj.weight with row 17 set to zeros (a pruned "
                 "channel)", name="layers.3.mlp.down_proj.weight with row 17 zeroed, (256, 768)")


@quantize_per_channel.case
def clipped_weights_are_clamped_to_127(impl: Callable) -> None:
    """With clip < 1 the weights past clip * max|w| are clamped to ±127: every code stays in [-127, 127]"""
    weight = torch.tensor([[127.0, 50.0, -100.0, 10.0, -127.0], [1.0, -0.9, 0.2, 0.75, -0.1]])
    _per_channel(impl, weight, "clip 0.5: row 0's scale is 0.5, so 127 / 0.5 = 254 must become 127", clip=0.5)
    _per_channel(impl, weight, "clip 0.8: the weights beyond 0.8 of each row's largest are clamped", clip=0.8)
    qkv = shipped_weight("layers.0.self_attn.qkv_proj.weight")
    _per_channel(impl, qkv, "the shipped model's weights clipped at 0.7 of each row's largest", clip=0.7,
                 name="layers.0.self_attn.qkv_proj.weight, (512, 256)")


@quantize_per_channel.case
def the_shipped_models_weights(impl: Callable) -> None:
    """On the shipped model's weights, the codes and scales the engine stores (minillm/quantization/formats.py)"""
    for name in ("layers.3.mlp.down_proj.weight", "layers.0.self_attn.qkv_proj.weight",
                 "layers.6.self_attn.o_proj.weight"):
        weight = shipped_weight(name)
        _per_channel(impl, weight, "as quantize_int8 quantizes it", name=f"{name}, {tuple(weight.shape)}")


# --------------------------------------------------------------------------- dequantize per channel


def _dequantized(impl: Callable, call_args: tuple[torch.Tensor, ...], want: torch.Tensor, given: str, why: str,
                 explain: Callable[[int, int], str]) -> None:
    """`impl(*call_args)` must be the float32 tensor `want` (to float rounding), and leave its arguments alone."""
    mine = tuple(a.clone() for a in call_args)
    expected = f"a float32 tensor of shape {tuple(want.shape)} ({why})"
    got = call(given, expected, impl, *mine)
    for theirs, original, name in zip(mine, call_args, ("codes", "scale", "minimum")):
        _unchanged(theirs, original, given, name)
    if not isinstance(got, torch.Tensor):
        fail(given, expected, _kind(got))
    _layout(got, "the result", tuple(want.shape), torch.float32, given, "numbers, not codes")
    bad = ~torch.isclose(got.double(), want.double(), rtol=1e-5, atol=1e-7)
    if bad.any():
        n, k = (int(i) for i in bad.nonzero()[0])
        others = int(bad.sum()) - 1
        fail(given, f"[{n}, {k}] = {float(want[n, k]):.6g} ({explain(n, k)}; {why})",
             f"{float(got[n, k]):.6g}" + (f" ({others} other entr{'ies differ' if others > 1 else 'y differs'} too)"
                                       if others else ""))


def _dequantize_rows(impl: Callable, codes: torch.Tensor, scale: torch.Tensor, why: str, name: str | None = None
                     ) -> None:
    given = f"dequantize_per_channel({name or f'codes={listed(codes)}, scale={listed(scale)}'})"
    want = codes.double() * scale.double()[:, None]

    def explain(n: int, k: int) -> str:
        return f"codes[{n}, {k}] * scale[{n}] = {int(codes[n, k])} * {float(scale[n]):.6g}"

    _dequantized(impl, (codes, scale), want, given, why, explain)


@dequantize_per_channel.case
def dequantize_per_channel_example(impl: Callable) -> None:
    """The notebook's example: codes [[50, -127, 30, 0], [127, 2, -3, 4]] with scales [0.01, 0.5]"""
    _dequantize_rows(impl, torch.tensor([[50, -127, 30, 0], [127, 2, -3, 4]], dtype=torch.int8),
                     torch.tensor([0.01, 0.5]), "the example of the contract")


@dequantize_per_channel.case
def each_row_has_its_own_scale(impl: Callable) -> None:
    """Row n's codes are multiplied by scale[n]: one scale per output row, not per input column"""
    codes = torch.tensor([[1, -2, 3, -4, 5], [10, 20, -30, 40, -127], [127, 0, -1, 64, -64]], dtype=torch.int8)
    _dequantize_rows(impl, codes, torch.tensor([0.5, 2.0, 0.001]), "3 rows of 5 codes, scales 0.5, 2 and 0.001")
    square = torch.tensor([[1, 2], [3, 4]], dtype=torch.int8)
    _dequantize_rows(impl, square, torch.tensor([10.0, 0.1]), "row 0 times 10, row 1 times 0.1")


@dequantize_per_channel.case
def the_result_is_float32_numbers(impl: Callable) -> None:
    """The result is float32 numbers (codes * scale), not codes: 3 * 0.3 is 0.9, not 0 or 1"""
    _dequantize_rows(impl, torch.tensor([[3, -7, 127]], dtype=torch.int8), torch.tensor([0.3]),
                     "fractions must survive")


@dequantize_per_channel.case
def the_engines_codes_come_back(impl: Callable) -> None:
    """The engine's int8 codes of the shipped model come back as the engine dequantizes them (Int8Weight.dequantize)"""
    from minillm.quantization.formats import quantize_int8

    for name in ("layers.3.mlp.down_proj.weight", "layers.0.self_attn.qkv_proj.weight"):
        stored = quantize_int8(shipped_weight(name))
        _dequantize_rows(impl, stored.q, stored.scale, "as Int8Weight.dequantize gives it",
                         name=f"<the engine's codes and scales of {name}, {tuple(stored.q.shape)}>")


# ----------------------------------------------------------------------------------- quantize groups


def _groups(impl: Callable, weight: torch.Tensor, group_size: int, why: str, name: str | None = None
            ) -> None:
    n, k = weight.shape
    given = f"quantize_groups({name or _shown(weight)}, group_size={group_size})"
    want_codes, want_scale, want_min = reference_groups(weight, group_size)
    mine = weight.clone()
    expected = f"(codes uint8 {(n, k)}, scale float32 {(n, k // group_size)}, minimum float32 " \
               f"{(n, k // group_size)}) ({why})"
    got = call(given, expected, impl, mine, group_size)
    _unchanged(mine, weight, given)
    codes, scale, minimum = _tensors(got, 3, given, expected)
    hint = "one per group of consecutive inputs of a row" + (
        ": this is one per group of output rows" if tuple(scale.shape) == (n // group_size, k) else "")
    _layout(scale, "scale", (n, k // group_size), torch.float32, given, hint)
    _layout(minimum, "minimum", (n, k // group_size), torch.float32, given, hint)
    _layout(codes, "codes", (n, k), torch.uint8, given, "values 0..15")
    w = weight.detach().double()

    def columns(row: int, g: int) -> str:
        return f"w[{row}, {g * group_size}:{(g + 1) * group_size}]"

    def minimum_rule(row: int, g: int) -> str:
        return f"the smallest of {columns(row, g)}, group {g} of row {row}"

    def scale_rule(row: int, g: int) -> str:
        part = w[row, g * group_size:(g + 1) * group_size]
        low, high = float(part.min()), float(part.max())
        if low == high:
            return f"{columns(row, g)} is constant ({low:g}): scale 1"
        return f"(max - min) / 15 of {columns(row, g)} = ({high:.6g} - {low:.6g}) / 15"

    _scales_match(minimum, want_min, "minimum", given, minimum_rule, why)
    _scales_match(scale, want_scale, "scale", given, scale_rule, why)
    ratio = (w - want_min.double().repeat_interleave(group_size, dim=1)) / \
        want_scale.double().repeat_interleave(group_size, dim=1)

    def code_rule(row: int, col: int) -> str:
        g, x = col // group_size, float(ratio[row, col])
        return (f"(w - minimum) / scale = ({float(w[row, col]):.6g} - {float(want_min[row, g]):.6g}) / "
                f"{float(want_scale[row, g]):.6g} = {x:.4f}, {_halves(x)}")

    _codes_match(codes, want_codes, ratio, given, code_rule, why)


GROUPS_EXAMPLE = torch.tensor([[0.0, 1.5, 3.0, 7.5, -1.0, -1.0, -1.0, -1.0],
                               [2.0, 3.5, 5.0, 17.0, 0.0, 15.0, 6.5, 7.5]])


@quantize_groups.case
def quantize_groups_example(impl: Callable) -> None:
    """The notebook's example: G = 4, minimum [[0, -1], [2, 0]], scale [[0.5, 1], [1, 1]]"""
    _groups(impl, GROUPS_EXAMPLE, 4, "the example of the contract")


@quantize_groups.case
def groups_are_consecutive_inputs_of_a_row(impl: Callable) -> None:
    """Group g of row n is w[n, g*G : (g+1)*G], consecutive inputs, each group with its own scale and minimum"""
    weight = torch.tensor([[0.0, 0.1, 0.2, 0.3, 10.0, 10.5, 11.0, 12.0, -4.0, -3.0, -2.5, -1.0],
                           [1.0, 0.0, 3.0, 1.5, -0.2, 0.2, 0.0, 0.1, 100.0, 130.0, 115.0, 101.0]])
    _groups(impl, weight, 4, "three groups per row with very different ranges: columns 0-3, 4-7 and 8-11")
    _groups(impl, weight, 6, "two groups per row: columns 0-5 and 6-11")
    down = shipped_weight("layers.3.mlp.down_proj.weight")
    _groups(impl, with_outlier(down, 9, 40), 32, "the shipped model's layers.3.mlp.down_proj.weight with an outlier "
            "at [9, 40]: it widens group 1 of row 9 only", name="layers.3.mlp.down_proj.weight with an outlier at "
            "[9, 40], (256, 768)")


@quantize_groups.case
def the_codes_span_the_groups_own_range(impl: Callable) -> None:
    """Asymmetric: a group's smallest weight is its minimum and gets code 0, its largest gets code 15"""
    weight = torch.tensor([[0.1, 0.2, 0.3, 0.4, -0.4, -0.3, -0.1, -0.2],
                           [5.0, 5.25, 5.5, 8.75, -3.0, 0.0, 0.75, 0.5]])
    _groups(impl, weight, 4, "all-positive and all-negative groups: the 16 codes cover [min, max], not [-max|w|, "
            "max|w|]")


@quantize_groups.case
def codes_count_steps_up_from_the_minimum(impl: Callable) -> None:
    """Codes count steps up from the group's minimum: round((w - minimum) / scale), not round(w / scale)"""
    weight = torch.tensor([[10.0, 10.5, 13.0, 17.5, 11.0, 16.0, 12.5, 14.0]])
    _groups(impl, weight, 8, "minimum 10, scale 0.5: w = 13 is 6 steps above the minimum")


@quantize_groups.case
def group_codes_round_to_the_nearest_integer(impl: Callable) -> None:
    """Codes are rounded to the nearest integer, not toward zero; a half goes to the even neighbour"""
    weight = torch.tensor([[0.0, 15.0, 2.7, 2.2, 6.5, 7.5, 0.4, 14.6]])
    _groups(impl, weight, 8, "minimum 0, scale exactly 1: 2.7 -> 3, 2.2 -> 2, 6.5 -> 6, 7.5 -> 8, 0.4 -> 0, "
            "14.6 -> 15")


@quantize_groups.case
def a_constant_group_gets_scale_one(impl: Callable) -> None:
    """A constant group gets scale 1, its value as minimum and codes 0: exact, and no division by zero"""
    weight = torch.tensor([[0.0, 0.0, 0.0, 0.0, 3.25, 3.25, 3.25, 3.25],
                           [-1.0, -1.0, -1.0, -1.0, 0.5, 1.0, 2.0, 0.25]])
    _groups(impl, weight, 4, "groups of zeros, of 3.25s and of -1s")


@quantize_groups.case
def the_shipped_models_weights_in_groups(impl: Callable) -> None:
    """On the shipped model's weights, the codes, scales and minimums the engine stores, for G = 32, 64 and 128"""
    for name, group_size in (("layers.3.mlp.down_proj.weight", 32), ("layers.3.mlp.down_proj.weight", 128),
                             ("layers.0.self_attn.qkv_proj.weight", 64), ("layers.6.self_attn.o_proj.weight", 32)):
        weight = shipped_weight(name)
        _groups(impl, weight, group_size, "as quantize_int4 quantizes it", name=f"{name}, {tuple(weight.shape)}")


# --------------------------------------------------------------------------------- dequantize groups


def _dequantize_groups(impl: Callable, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, why: str,
                       name: str | None = None) -> None:
    group_size = codes.shape[1] // scale.shape[1]
    given = (f"dequantize_groups({name})" if name else
             f"dequantize_groups(codes={listed(codes)}, scale={listed(scale)}, minimum={listed(minimum)})")
    want = codes.double() * scale.double().repeat_interleave(group_size, dim=1) + \
        minimum.double().repeat_interleave(group_size, dim=1)

    def explain(n: int, k: int) -> str:
        g = k // group_size
        return (f"codes[{n}, {k}] * scale[{n}, {g}] + minimum[{n}, {g}] = {int(codes[n, k])} * "
                f"{float(scale[n, g]):.6g} + {float(minimum[n, g]):.6g}, group {g} = {k} // {group_size}")

    _dequantized(impl, (codes, scale, minimum), want, given, why, explain)


@dequantize_groups.case
def dequantize_groups_example(impl: Callable) -> None:
    """The notebook's example: codes [[0, 3, 6, 15, 0, 0, 0, 0]], scale [[0.5, 1]], minimum [[0, -1]]"""
    _dequantize_groups(impl, torch.tensor([[0, 3, 6, 15, 0, 0, 0, 0]], dtype=torch.uint8), torch.tensor([[0.5, 1.0]]),
                       torch.tensor([[0.0, -1.0]]), "the example of the contract")


@dequantize_groups.case
def each_code_uses_its_own_groups_scale(impl: Callable) -> None:
    """Code k of a row uses group k // G's scale and minimum: groups of consecutive inputs"""
    codes = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15], [15, 14, 13, 12, 0, 0, 1, 1, 7, 8, 9, 10]],
                         dtype=torch.uint8)
    scale = torch.tensor([[1.0, 10.0, 100.0], [0.5, 0.25, 2.0]])
    minimum = torch.tensor([[0.0, -5.0, 1.0], [-1.0, 0.0, 3.0]])
    _dequantize_groups(impl, codes, scale, minimum, "G = 4: columns 0-3 use group 0, 4-7 group 1, 8-11 group 2")


@dequantize_groups.case
def the_minimum_is_added_back(impl: Callable) -> None:
    """The group's minimum is added back: codes * scale + minimum"""
    _dequantize_groups(impl, torch.tensor([[0, 6, 15, 1]], dtype=torch.uint8), torch.tensor([[0.5]]),
                       torch.tensor([[10.0]]), "minimum 10: code 0 stands for 10, not 0")


@dequantize_groups.case
def the_groups_result_is_float32_numbers(impl: Callable) -> None:
    """The result is float32 numbers, not codes"""
    _dequantize_groups(impl, torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8), torch.tensor([[0.3, 0.7]]),
                       torch.tensor([[-0.05, 0.01]]), "fractions must survive")


@dequantize_groups.case
def the_engines_group_codes_come_back(impl: Callable) -> None:
    """The engine's 4-bit codes of the shipped model come back as the engine dequantizes them (Int4Weight)"""
    from minillm.quantization.formats import quantize_int4

    for name, group_size in (("layers.3.mlp.down_proj.weight", 32), ("layers.0.self_attn.qkv_proj.weight", 128)):
        stored = quantize_int4(shipped_weight(name), group_size)
        _dequantize_groups(impl, stored.q, stored.scale, stored.minimum, "as Int4Weight.dequantize gives it",
                           name=f"<the engine's codes, scales and minimums of {name}, group_size={group_size}>")


# ------------------------------------------------------------------------------------ fastest scheme


def scheme(bits: float, group_size: int | None = None, group_bytes: float = 0, dequant_flops: float = 0) -> dict:
    return {"bits": bits, "group_size": group_size, "group_bytes": group_bytes, "dequant_flops": dequant_flops}


BF16, INT8 = scheme(16), scheme(8, dequant_flops=1)
INT4_G128, INT4_G32 = scheme(4, 128, 4, dequant_flops=2), scheme(4, 32, 4, dequant_flops=2)
THREE = {"bf16": BF16, "int8": INT8, "int4 g128": INT4_G128}
LLAMA_8B = {"num_weights": 8e9, "kv_bytes_per_token": 131072}  # 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes
H100 = {"bandwidth_gb_s": 3350, "tflops": 990}
LAPTOP = {"bandwidth_gb_s": 60, "tflops": 0.5}


def step_times(schemes: dict[str, dict], num_weights: float, kv_bytes_per_token: float, context_lengths: list[int],
               bandwidth_gb_s: float, tflops: float) -> dict[str, tuple[float, str]]:
    """The reference: each scheme's step time (ms) and what bounds it."""
    times = {}
    for name, s in schemes.items():
        weight_bytes = num_weights * s["bits"] / 8
        if s["group_size"] is not None:
            weight_bytes += num_weights / s["group_size"] * s["group_bytes"]
        read_ms = 1000 * (weight_bytes + sum(context_lengths) * kv_bytes_per_token) / (bandwidth_gb_s * 1e9)
        compute_ms = 1000 * len(context_lengths) * num_weights * (2 + s["dequant_flops"]) / (tflops * 1e12)
        times[name] = (max(read_ms, compute_ms), "bytes" if read_ms >= compute_ms else "FLOPs")
    return times


def _contexts(context_lengths: list[int]) -> str:
    if len(set(context_lengths)) == 1 and len(context_lengths) > 3:
        return f"[{context_lengths[0]}] * {len(context_lengths)}"
    if len(context_lengths) > 8:
        return f"<{len(context_lengths)} lengths, {sum(context_lengths)} tokens in all>"
    return str(context_lengths)


def _fastest(impl: Callable, why: str, schemes: dict[str, dict], context_lengths: list[int], num_weights: float,
             kv_bytes_per_token: float, bandwidth_gb_s: float, tflops: float) -> None:
    given = (f"fastest_scheme({schemes}, num_weights={num_weights:g}, kv_bytes_per_token={kv_bytes_per_token:g}, "
             f"context_lengths={_contexts(context_lengths)}, bandwidth_gb_s={bandwidth_gb_s:g}, tflops={tflops:g})")
    times = step_times(schemes, num_weights, kv_bytes_per_token, context_lengths, bandwidth_gb_s, tflops)
    least = min(t for t, _ in times.values())
    want = next(name for name, (t, _) in times.items() if t <= least + 1e-9)
    shown = ", ".join(f"{name} {t:.4g} ms ({bound})" for name, (t, bound) in times.items())
    expected = f"{want!r} ({why}; step times, bound by: {shown})"
    copies = ({name: dict(s) for name, s in schemes.items()}, list(context_lengths))
    got = call(given, expected, impl, copies[0], num_weights, kv_bytes_per_token, copies[1], bandwidth_gb_s, tflops)
    expect(isinstance(got, str) and got == want, given, expected, repr(got))
    expect(copies == (schemes, context_lengths), f"after {given}", "the arguments unchanged", "they were modified")


@fastest_scheme.case
def fastest_scheme_example(impl: Callable) -> None:
    """The notebook's example: int4 at batch 1, bf16 for 512 short requests"""
    _fastest(impl, "bound by bandwidth: the fewest bytes win", THREE, [2000], **LLAMA_8B, **H100)
    _fastest(impl, "bound by arithmetic: the least unpacking wins", THREE, [100] * 512, **LLAMA_8B, **H100)


@fastest_scheme.case
def at_batch_one_the_fewest_bytes_win(impl: Callable) -> None:
    """At batch 1 a GPU's step is bound by bandwidth: the scheme with the fewest bytes wins"""
    _fastest(impl, "a 70B model, a long context", THREE, [8000], 70e9, 327680, **H100)
    _fastest(impl, "a 1B model on a laptop CPU", THREE, [500], 1e9, 32768, **LAPTOP)


@fastest_scheme.case
def large_batches_are_bound_by_arithmetic(impl: Callable) -> None:
    """Large batches of short requests are bound by arithmetic, which grows with the batch: the least unpacking wins"""
    _fastest(impl, "1024 requests at context 50", THREE, [50] * 1024, **LLAMA_8B, **H100)
    _fastest(impl, "256 requests at context 20 on a device with less compute", THREE, [20] * 256, 8e9, 131072, 2000,
             300)


@fastest_scheme.case
def the_unpacking_is_paid_for_every_token(impl: Callable) -> None:
    """The unpacking is paid for every token of the batch: costly unpacking makes int4 lose on a CPU at batch 4"""
    schemes = {"bf16": BF16, "int4 g32 (slow unpacking)": scheme(4, 32, 4, dequant_flops=8)}
    _fastest(impl, "4 tokens x 10 FLOPs per weight outweigh the bytes int4 saves", schemes, [300] * 4, 1e9, 32768,
             **LAPTOP)


@fastest_scheme.case
def cached_tokens_are_read_too(impl: Callable) -> None:
    """Every cached token is read too: long contexts keep even a large batch bound by bandwidth"""
    _fastest(impl, "256 requests at context 4000: 134 GB of KV cache per step", THREE, [4000] * 256, **LLAMA_8B, **H100)
    _fastest(impl, "mixed contexts", THREE, [30000, 12000, 500, 64000] * 16, **LLAMA_8B, **H100)


@fastest_scheme.case
def the_roofline_takes_the_slower_not_the_sum(impl: Callable) -> None:
    """The step takes the slower of reading and computing (the roofline), not their sum"""
    _fastest(impl, "at 100 requests int4 is already bound by arithmetic, int8 still by bytes", THREE, [100] * 100,
             **LLAMA_8B, **H100)
    _fastest(impl, "at 150 requests of 1000 tokens", THREE, [1000] * 150, **LLAMA_8B, **H100)


@fastest_scheme.case
def the_scales_of_each_group_are_bytes_too(impl: Callable) -> None:
    """The scales of each group are bytes too: small groups cost bandwidth"""
    _fastest(impl, "group 32 reads 0.625 bytes per weight, group 128 0.531", {"int4 g32": INT4_G32,
             "int4 g128": INT4_G128}, [1000], **LLAMA_8B, **H100)
    _fastest(impl, "groups of 8 with an fp32 scale and minimum each: 1.5 bytes per weight, more than int8's 1",
             {"int4 g8": scheme(4, 8, 8, dequant_flops=2), "int8": INT8}, [1000], **LLAMA_8B, **H100)


@fastest_scheme.case
def among_equal_times_the_first(impl: Callable) -> None:
    """Among equal step times, the first scheme in the dict's order"""
    _fastest(impl, "4 bytes per 64 weights = 8 bytes per 128: the same bytes, the same FLOPs",
             {"int4 g64": scheme(4, 64, 4, 2), "int4 g128 fp32": scheme(4, 128, 8, 2)}, [1000], **LLAMA_8B, **H100)
    _fastest(impl, "bound by arithmetic, fp8 (no unpacking on a GPU that multiplies fp8) ties with bf16",
             {"fp8": scheme(8), "bf16": BF16}, [50] * 1024, **LLAMA_8B, **H100)


@fastest_scheme.case
def random_servers(impl: Callable) -> None:
    """Random models, devices and batches: the scheme the roofline gives"""
    rng = random.Random(12)
    for _ in range(40):
        group = rng.choice([32, 64, 128])
        schemes = {"bf16": BF16, "int8": scheme(8, dequant_flops=rng.choice([0, 1, 2])),
                   f"int4 g{group}": scheme(4, group, rng.choice([2, 4]), rng.choice([1, 2, 4, 8]))}
        names = list(schemes)
        rng.shuffle(names)
        batch = rng.choice([1, 2, 8, 32, 64, 128, 256, 512, 1024])
        contexts = [rng.randint(1, 8000) for _ in range(batch)]
        device = rng.choice([(3350, 990), (2039, 312), (4800, 989), (60, 0.5), (100, 2), (300, 20)])
        _fastest(impl, "as the roofline gives it", {n: schemes[n] for n in names}, contexts,
                 rng.choice([0.5e9, 1e9, 8e9, 70e9]), rng.choice([16384, 32768, 131072, 327680]), *device)
