"""ch13's graders, proven both ways: each passes the solution and correct answers written differently (copies
instead of views, torch.chunk), reports the untouched stub as "not started", and rejects every wrong answer of
wrong_answers.py naming its rule. The sharding references are the engine's split (minillm/distributed/
sharding.py), and the solution's pieces rebuild the shipped model's own MLP; the FAIL lines say which case, what
was expected and what came."""

from __future__ import annotations

import pytest
import torch

from exercises.grading import EXERCISES, load, run
from exercises.grading.ch13 import (
    BLOCK,
    KINDS,
    random_layer,
    reference_bytes,
    reference_column,
    reference_points,
    reference_row,
)
from minillm.distributed.sharding import COLUMN_PARALLEL, ROW_PARALLEL, TensorShard
from solutions.ch13_allreduce_placement import OP_KINDS, allreduce_bytes, allreduce_points
from solutions.ch13_shard_linear import column_shard, row_shard
from tests.exercises.wrong_answers import (
    WRONG,
    allreduce_bytes_counts_numbers,
    allreduce_bytes_of_one_token,
    allreduce_bytes_one_per_layer,
    allreduce_bytes_with_the_embedding,
    allreduce_points_after_every_linear_layer,
    column_shard_splits_the_inputs,
    column_shard_strided,
    row_shard_bias_on_every_rank,
)

NAMES = [name for name in EXERCISES if name.startswith("ch13.")]
CH13_WRONG = [w for w in WRONG if w[0].startswith("ch13.")]


def _failed(name, impl) -> list[str]:
    return [r.line() for r in run(name, impl) if not r.passed]


def test_chapter_13_has_its_four_exercises():
    assert NAMES == ["ch13.column_shard", "ch13.row_shard", "ch13.allreduce_points", "ch13.allreduce_bytes"]
    assert {EXERCISES[name].chapter for name in NAMES} == {"ch13"}


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_passes_and_the_stub_is_not_started(name):
    assert not _failed(name, load(name, "solutions"))
    assert all(r.status == "not started" for r in run(name, load(name, "exercises")))


@pytest.mark.parametrize(("name", "impl", "rule"), CH13_WRONG, ids=[f"{n}-{i.__name__}" for n, i, _ in CH13_WRONG])
def test_every_wrong_answer_fails_naming_its_rule(name, impl, rule):
    failures = _failed(name, impl)
    assert any(rule in line for line in failures), "\n".join(failures)
    assert all(" expected " in line and ", got " in line for line in failures), "\n".join(failures)


def test_the_wrong_answers_the_issue_names_are_all_there():
    names = {impl.__name__ for _, impl, _ in CH13_WRONG}
    assert {"column_shard_strided", "row_shard_strided", "row_shard_bias_on_every_rank",
            "column_shard_whole_bias_on_every_rank", "column_shard_splits_the_inputs", "row_shard_splits_the_outputs",
            "column_shard_next_piece", "row_shard_previous_piece", "column_shard_one_row_too_many",
            "allreduce_points_after_every_linear_layer", "allreduce_points_after_column_parallel_layers",
            "allreduce_bytes_one_per_layer", "allreduce_bytes_of_one_token"} <= names
    assert all(sum(n == name for n, _, _ in CH13_WRONG) >= 2 for name in NAMES)


def test_the_exercise_and_the_solution_state_the_same_table():
    from exercises.ch13_allreduce_placement import OP_KINDS as stated

    assert stated == OP_KINDS == KINDS


# ----------------------------------------------------------------------------- correct answers written differently


def column_shard_copies(weight, bias, rank, size):
    """Correct, with torch.chunk and copies instead of views."""
    if weight.shape[0] % size:
        raise ValueError("size must divide out_features")
    return (weight.chunk(size, dim=0)[rank].clone(),
            None if bias is None else bias.chunk(size)[rank].contiguous().clone())


def row_shard_copies(weight, bias, rank, size):
    if weight.shape[1] % size:
        raise ValueError("size must divide in_features")
    piece = weight.tensor_split(size, dim=1)[rank].contiguous()
    return piece, bias.clone() if bias is not None and rank == 0 else None


def test_copies_instead_of_views_pass():
    assert not _failed("ch13.column_shard", column_shard_copies)
    assert not _failed("ch13.row_shard", row_shard_copies)


def test_the_solution_returns_views_and_that_is_fine():
    weight, bias = random_layer(8, 4, seed=0)
    piece, bias_piece = column_shard(weight, bias, 1, 2)
    assert piece.data_ptr() == weight[4].data_ptr() and bias_piece.data_ptr() == bias[4:].data_ptr()


def test_a_tuple_of_allreduce_points_passes():
    assert not _failed("ch13.allreduce_points", lambda block: tuple(allreduce_points(block)))


def test_modifying_the_layer_fails_its_own_rule():
    def column_shard_zeroes_the_weight(weight, bias, rank, size):
        piece, bias_piece = reference_column(weight.clone(), None if bias is None else bias.clone(), rank, size)
        if weight.shape[0] % size:
            raise ValueError("size must divide out_features")
        weight.zero_()  # the whole layer spoilt for the other ranks
        return piece, bias_piece

    failures = _failed("ch13.column_shard", column_shard_zeroes_the_weight)
    assert len(failures) == 1 and "the weight and the bias unchanged" in failures[0], failures


# ----------------------------------------------------------------------------- the references are the engine's


class _Config:
    """The few fields of a ModelConfig that TensorShard reads for the MLP and o_proj."""

    def __init__(self, num_heads=4, head_dim=64, intermediate_size=768):
        self.num_heads, self.head_dim, self.intermediate_size = num_heads, head_dim, intermediate_size


@pytest.mark.parametrize("size", [1, 2, 4])
def test_the_references_are_the_engines_split(size):
    assert ("qkv_proj" in COLUMN_PARALLEL and "gate_up_proj" in COLUMN_PARALLEL
            and set(ROW_PARALLEL) == {"o_proj", "down_proj"})
    config = _Config()
    down, down_bias = random_layer(256, 768, seed=1)
    o_proj, _ = random_layer(256, 256, seed=2)
    gate, _ = random_layer(768, 256, seed=3)
    up, _ = random_layer(768, 256, seed=4)
    for rank in range(size):
        shard = TensorShard(rank, size)
        assert torch.equal(shard.shard("layers.0.mlp.down_proj.weight", down, config),
                           reference_row(down, None, rank, size)[0])
        assert torch.equal(shard.shard("layers.0.self_attn.o_proj.weight", o_proj, config),
                           reference_row(o_proj, None, rank, size)[0])
        assert shard.holds("layers.0.mlp.down_proj.bias") == (reference_row(down, down_bias, rank, size)[1] is not None)
        # gate_up_proj is two column-parallel layers fused: the rank's rows of gate, then the same rows of up
        assert torch.equal(shard.shard("layers.0.mlp.gate_up_proj.weight", torch.cat([gate, up]), config),
                           torch.cat([reference_column(gate, None, rank, size)[0],
                                      reference_column(up, None, rank, size)[0]]))


@pytest.mark.parametrize("size", [2, 4])
def test_the_solutions_pieces_rebuild_the_shipped_models_mlp(size):
    """The shipped model's layer-3 MLP, split by the solution over `size` ranks, one sum at the end."""
    import minillm

    model = minillm.load_model()
    mlp = model.layers[3].mlp
    inter = mlp.intermediate_size
    gate, up = mlp.gate_up_proj.weight.detach().split(inter)
    down = mlp.down_proj.weight.detach()
    x = torch.randn(5, down.shape[0], generator=torch.Generator().manual_seed(0))
    total = torch.zeros_like(x)
    for rank in range(size):
        g, _ = column_shard(gate, None, rank, size)
        u, _ = column_shard(up, None, rank, size)
        d, _ = row_shard(down, None, rank, size)
        total += (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T
    with torch.no_grad():
        whole = mlp(x)
    assert torch.allclose(total, whole, rtol=1e-4, atol=1e-5)
    assert allreduce_points(BLOCK) == reference_points(BLOCK) == [4, 9]


# ----------------------------------------------------------------------------- what the FAIL lines say


def test_a_strided_split_names_the_rows_it_took():
    line = next(line for line in _failed("ch13.column_shard", column_shard_strided)
                if line.startswith("FAIL  Rank r holds the contiguous output rows"))
    assert "expected weight_piece = weight[0:4, :], rows 0..3 of the weight: piece 0 of 2" in line
    assert line.endswith("got rows [0, 2, 4, 6] of the weight, (4, 6)")


def test_splitting_the_wrong_dimension_is_named_as_such():
    failures = _failed("ch13.column_shard", column_shard_splits_the_inputs)
    assert any("got columns 0..2 of the weight, (8, 3) (this splits the input columns, which is row_shard's split)"
               in line for line in failures), "\n".join(failures)


def test_a_bias_on_every_rank_is_reported_by_rank_and_in_the_sum():
    failures = _failed("ch13.row_shard", row_shard_bias_on_every_rank)
    bias = next(line for line in failures if line.startswith("FAIL  The bias is added once"))
    assert "rank=1, size=2): expected bias_piece None (rank 1 is not rank 0;" in bias
    assert bias.endswith("got the whole bias, all 6 entries")
    summed = next(line for line in failures if line.startswith("FAIL  The ranks' partial outputs, summed"))
    assert "the bias added once" in summed


def test_an_allreduce_after_every_linear_layer_names_the_operations():
    line = next(line for line in _failed("ch13.allreduce_points", allreduce_points_after_every_linear_layer)
                if line.startswith("FAIL  A column-parallel layer writes whole values"))
    assert "expected [4, 9]: after 4 o_proj, 9 down_proj" in line
    assert line.endswith("got [1, 4, 7, 9]: after 1 qkv_proj, 4 o_proj, 7 gate_up_proj, 9 down_proj")


def test_one_allreduce_per_layer_is_shown_as_half():
    line = next(line for line in _failed("ch13.allreduce_bytes", allreduce_bytes_one_per_layer)
                if line.startswith("FAIL  Two all-reduces per layer"))
    assert "expected 2048 bytes more for the second layer (its two all-reduces, each 1 x 1024 numbers" in line
    assert line.endswith("got 1024 more (0.5 times as much)")


@pytest.mark.parametrize(("impl", "rule"), [
    (allreduce_bytes_one_per_layer, "Two all-reduces per layer"),
    (allreduce_bytes_counts_numbers, "Bytes, not numbers"),
    (allreduce_bytes_of_one_token, "every token's hidden state"),
    (allreduce_bytes_with_the_embedding, "not the embedding's")])
def test_one_mistake_in_the_bytes_fails_only_its_own_rule_beside_the_examples(impl, rule):
    """The rules about one argument each are independent: a learner's single mistake is named once (the examples
    and the random cases, which check everything, fail with it)."""
    failures = _failed("ch13.allreduce_bytes", impl)
    own = [line for line in failures if rule in line]
    others = [line for line in failures if rule not in line
              and not line.startswith(("FAIL  The notebook's examples", "FAIL  Random"))]
    assert own and not others, "\n".join(failures)


def test_a_float_is_not_an_int():
    failures = _failed("ch13.allreduce_bytes", lambda *args: float(allreduce_bytes(*args)))
    assert failures and all("(an int is expected)" in line for line in failures)


def test_the_contracts_examples():
    """The numbers the exercises' docstrings quote."""
    weight, bias = torch.arange(8.0).reshape(4, 2), torch.tensor([10.0, 20.0, 30.0, 40.0])
    assert [column_shard(weight, bias, r, 2)[0].tolist() for r in (0, 1)] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [column_shard(weight, bias, r, 2)[1].tolist() for r in (0, 1)] == [[10, 20], [30, 40]]
    weight, bias = torch.arange(8.0).reshape(2, 4), torch.tensor([10.0, 20.0])
    assert [row_shard(weight, bias, r, 2)[0].tolist() for r in (0, 1)] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert row_shard(weight, bias, 0, 2)[1].tolist() == [10, 20] and row_shard(weight, bias, 1, 2)[1] is None
    with pytest.raises(ValueError):
        column_shard(torch.zeros(6, 4), None, 0, 4)
    with pytest.raises(ValueError):
        row_shard(torch.zeros(4, 6), None, 0, 4)
    assert allreduce_points(BLOCK) == [4, 9] and allreduce_points([]) == []
    with pytest.raises(ValueError, match="lm_head"):
        allreduce_points(["lm_head"])
    assert allreduce_bytes(1, 4096, 2, 32) == 524288 == 512 * 1024
    assert allreduce_bytes(2000, 4096, 2, 32) == 1048576000
    assert allreduce_bytes(100, 256, 4, 8) == 1638400 == reference_bytes(100, 256, 4, 8)


def test_the_quiz_explains_every_option():
    from widgets.quiz import Question, load_questions, render_quiz

    questions = load_questions("ch13")
    assert len(questions) == 6 and all(isinstance(q, Question) for q in questions)
    assert all(len(q.why_not) == len(q.options) and q.why_not[q.answer] is None and
               all(text for i, text in enumerate(q.why_not) if i != q.answer) for q in questions)
    assert render_quiz(questions).count("data-correct='true'") == 6
