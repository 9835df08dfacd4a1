"""Chapter 13's cases: `ch13.column_shard` / `ch13.row_shard` (the piece of a linear layer one rank of a
tensor-parallel group holds), `ch13.allreduce_points` (where a decoder block must sum its ranks' partial
results) and `ch13.allreduce_bytes` (how many bytes those all-reduces carry per forward pass).

The sharding references are the engine's split (minillm/distributed/sharding.py: contiguous pieces, the
row-parallel bias on rank 0). Every sum is checked the way tensor parallelism uses it: the ranks' outputs
concatenated (column-parallel), summed (row-parallel), and a column-parallel layer feeding a row-parallel
one through an elementwise op with one sum at the end, equal to the whole layers."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from exercises.grading.core import call, exercise, expect, expect_raises, fail, listed

column_shard = exercise("ch13.column_shard", "ch13_shard_linear", "column_shard")
row_shard = exercise("ch13.row_shard", "ch13_shard_linear", "row_shard")
allreduce_points = exercise("ch13.allreduce_points", "ch13_allreduce_placement", "allreduce_points")
allreduce_bytes = exercise("ch13.allreduce_bytes", "ch13_allreduce_placement", "allreduce_bytes")

SIZES = (1, 2, 4)

# ----------------------------------------------------------------------------------------- references


def _piece(length: int, rank: int, size: int) -> slice:
    per = length // size
    return slice(rank * per, (rank + 1) * per)


def reference_column(weight: torch.Tensor, bias: torch.Tensor | None, rank: int, size: int
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank `rank`'s contiguous share of the output rows, and the same entries of the bias."""
    rows = _piece(weight.shape[0], rank, size)
    return weight[rows], None if bias is None else bias[rows]


def reference_row(weight: torch.Tensor, bias: torch.Tensor | None, rank: int, size: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank `rank`'s contiguous share of the input columns; the whole bias on rank 0, None elsewhere."""
    return weight[:, _piece(weight.shape[1], rank, size)], bias if rank == 0 else None


def random_layer(out_features: int, in_features: int, seed: int, bias: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A random float32 weight and bias: every row, column and bias entry differs (so a FAIL can say which
    rows or columns came back)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    return weight, (torch.randn(out_features, generator=gen) if bias else None)


def example_column() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(8.0).reshape(4, 2), torch.tensor([10.0, 20.0, 30.0, 40.0])


def example_row() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(8.0).reshape(2, 4), torch.tensor([10.0, 20.0])


# ----------------------------------------------------------------------------------------- helpers




def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    return repr(value) if not isinstance(value, tuple | list) else f"a {type(value).__name__} of {len(value)}"


def _shown(tensor: torch.Tensor | None, what: str) -> str:
    if tensor is None:
        return "None"
    if tensor.numel() <= 12:
        return listed(tensor)
    return f"<a random {' x '.join(map(str, tensor.shape))} {what}>"


def _given(fn: str, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, size: int) -> str:
    return f"{fn}(weight={_shown(weight, 'matrix')}, bias={_shown(bias, 'vector')}, rank={rank}, size={size})"


def _span(indices: list[int]) -> str:
    """[2, 3] -> '2..3'; [1, 3] -> '[1, 3]'."""
    if len(indices) > 1 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}..{indices[-1]}"
    return str(indices) if len(indices) != 1 else str(indices[0])


def _find(lines: torch.Tensor, whole: torch.Tensor) -> list[int] | None:
    """For each row of `lines`, the index of the equal row of `whole` (None when one has none)."""
    found = []
    for line in lines:
        hits = [i for i in range(whole.shape[0]) if whole[i].shape == line.shape and torch.equal(whole[i], line)]
        if not hits:
            return None
        found.append(hits[0])
    return found


def _which(piece: Any, weight: torch.Tensor) -> str:
    """What a returned weight piece holds: 'rows 0..1 of the weight', 'columns [0, 2] of the weight', or its kind."""
    if not isinstance(piece, torch.Tensor) or piece.dim() != 2 or piece.dtype != weight.dtype:
        return _kind(piece)
    if piece.shape[1] == weight.shape[1] and (rows := _find(piece, weight)) is not None:
        return f"row{'s' * (len(rows) != 1)} {_span(rows)} of the weight, {tuple(piece.shape)}"
    if piece.shape[0] == weight.shape[0] and (cols := _find(piece.T, weight.T)) is not None:
        return f"column{'s' * (len(cols) != 1)} {_span(cols)} of the weight, {tuple(piece.shape)}"
    return _kind(piece)


def _which_bias(piece: Any, bias: torch.Tensor | None) -> str:
    """What a returned bias piece holds: 'None', 'the whole bias', 'bias entries 2..3', or its kind."""
    if piece is None:
        return "None"
    if not isinstance(piece, torch.Tensor) or bias is None or piece.dim() != 1 or piece.dtype != bias.dtype:
        return _kind(piece)
    if piece.shape == bias.shape and torch.equal(piece, bias):
        return f"the whole bias, all {bias.shape[0]} entries"
    entries = _find(piece[:, None], bias[:, None])
    if entries is None:
        return _kind(piece)
    return f"bias entr{'ies' if len(entries) != 1 else 'y'} {_span(entries)}"


def _pair(got: Any, given: str, expected: str) -> tuple[Any, Any]:
    """`got` as (weight_piece, bias_piece), or a FAIL saying what came back instead."""
    if not isinstance(got, tuple | list) or len(got) != 2 or not isinstance(got[0], torch.Tensor) or \
            not (got[1] is None or isinstance(got[1], torch.Tensor)):
        shown = _kind(got) if not isinstance(got, tuple | list) else "(" + ", ".join(map(_kind, got)) + ")"
        fail(given, f"a tuple (weight_piece, bias_piece or None) {expected}", shown)
    return got[0], got[1]


def _shard(impl: Callable, fn: str, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, size: int
           ) -> tuple[str, Any, Any]:
    """Call the learner's `fn` on copies of the layer (a view it returns stays valid: nothing reuses the copies)."""
    given = _given(fn, weight, bias, rank, size)
    got = call(given, "rank's piece of the weight and bias", impl, weight.clone(),
               None if bias is None else bias.clone(), rank, size)
    piece, bias_piece = _pair(got, given, f"(rank {rank}'s share)")
    return given, piece, bias_piece


def _weight_piece(impl: Callable, kind: str, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, size: int,
                  why: str) -> None:
    """The weight piece must be the reference's: rank `rank`'s contiguous rows (column) or columns (row)."""
    fn = "column_shard" if kind == "column" else "row_shard"
    given, piece, _ = _shard(impl, fn, weight, bias, rank, size)
    out, inn = weight.shape
    if kind == "column":
        want, per = reference_column(weight, bias, rank, size)[0], out // size
        rule = (f"weight[{rank * per}:{(rank + 1) * per}, :], rows {_span(list(range(rank * per, (rank + 1) * per)))} "
                f"of the weight: piece {rank} of {size}, P = {out} // {size} = {per} output rows, {(per, inn)}")
        other = (out, inn // size) if inn % size == 0 else None
        other_hint = "this splits the input columns, which is row_shard's split"
    else:
        want, per = reference_row(weight, bias, rank, size)[0], inn // size
        rule = (f"weight[:, {rank * per}:{(rank + 1) * per}], columns "
                f"{_span(list(range(rank * per, (rank + 1) * per)))} of every row: piece {rank} of {size}, "
                f"P = {inn} // {size} = {per} input columns, {(out, per)}")
        other = (out // size, inn) if out % size == 0 else None
        other_hint = "this splits the output rows, which is column_shard's split"
    hint = f" ({other_hint})" if other is not None and tuple(piece.shape) == other and other != tuple(want.shape) \
        else ""
    expect(piece.dtype == weight.dtype, given, f"weight_piece of the weight's dtype, {weight.dtype}", _kind(piece))
    same = tuple(piece.shape) == tuple(want.shape) and torch.equal(piece, want)
    expect(same, given, f"weight_piece = {rule} ({why})", _which(piece, weight) + hint)


def _bias_piece(impl: Callable, kind: str, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, size: int,
                why: str) -> None:
    fn = "column_shard" if kind == "column" else "row_shard"
    given, _, got = _shard(impl, fn, weight, bias, rank, size)
    reference = reference_column if kind == "column" else reference_row
    want = reference(weight, bias, rank, size)[1]
    if want is None:
        reason = "a layer without a bias" if bias is None else f"rank {rank} is not rank 0"
        expect(got is None, given, f"bias_piece None ({reason}; {why})", _which_bias(got, bias))
        return
    if kind == "column":
        per = weight.shape[0] // size
        rows = _span(list(range(rank * per, (rank + 1) * per)))
        rule = f"bias[{rank * per}:{(rank + 1) * per}], the entries of its rows {rows}"
    else:
        rule = f"the whole bias, all {weight.shape[0]} entries, on rank 0"
    ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape and \
        torch.equal(got, want)
    expect(ok, given, f"bias_piece = {rule} ({why})", _which_bias(got, bias))


def _all_pieces(impl: Callable, fn: str, weight: torch.Tensor, bias: torch.Tensor | None, size: int
                ) -> list[tuple[Any, Any]]:
    return [_shard(impl, fn, weight, bias, rank, size)[1:] for rank in range(size)]


def _close(got: torch.Tensor, want: torch.Tensor, given: str, why: str, where: Callable[[int], str]) -> None:
    """`got` equals `want` to float rounding; a FAIL names the first output that is not, and its rank."""
    if got.shape != want.shape:
        fail(given, f"an output of shape {tuple(want.shape)} ({why})", f"one of shape {tuple(got.shape)}")
    bad = ~torch.isclose(got, want, rtol=1e-4, atol=1e-4)
    if bad.any():
        t, o = (int(i) for i in bad.nonzero()[0])
        others = int(bad.sum()) - 1
        more = f" ({others} other output{'s differ' if others > 1 else ' differs'} too)" if others else ""
        fail(given, f"output[{t}, {o}] = {float(want[t, o]):.6g} ({why}; {where(o)})", f"{float(got[t, o]):.6g}{more}")


def _run(given: str, expected: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The grader's own arithmetic on the learner's pieces; pieces that do not fit it are a FAIL."""
    try:
        return compute()
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        fail(given, expected, f"pieces that cannot be used that way ({type(err).__name__}: {first})")


def _input(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


def _two_layers(column_impl: Callable, row_impl: Callable, size: int, hidden: int, inter: int, seed: int,
                bias: bool = True) -> None:
    """A column-parallel layer, silu, a row-parallel layer, ONE sum: the two whole layers' output."""
    w1, b1 = random_layer(inter, hidden, seed, bias)
    w2, b2 = random_layer(hidden, inter, seed + 1, bias)
    x = _input(3, hidden, seed + 2)
    given = (f"up = column_shard(<a random {inter} x {hidden} weight>, <its bias>, rank, size={size}) and "
             f"down = row_shard(<a random {hidden} x {inter} weight>, <its bias>, rank, size={size}) for rank = "
             f"0..{size - 1}; each rank computes silu(x @ up_w.T + up_b) @ down_w.T (+ down_b where it got one); the "
             f"ranks' results summed ONCE" if bias else
             f"the same without biases: column_shard of a {inter} x {hidden} weight, row_shard of a {hidden} x {inter} "
             f"weight, size={size}")
    ups = [_pair(call(given, "the up layer's pieces", column_impl, w1.clone(), None if b1 is None else b1.clone(), r,
                      size), given, f"(rank {r})") for r in range(size)]
    downs = [_pair(call(given, "the down layer's pieces", row_impl, w2.clone(), None if b2 is None else b2.clone(), r,
                        size), given, f"(rank {r})") for r in range(size)]
    why = "the two whole layers' output: silu(x @ W1.T + b1) @ W2.T + b2"

    def tensor_parallel() -> torch.Tensor:
        total = torch.zeros(x.shape[0], hidden)
        for (uw, ub), (dw, db) in zip(ups, downs):
            h = x @ uw.T + (ub if ub is not None else 0)
            partial = torch.nn.functional.silu(h) @ dw.T
            total = total + partial + (db if db is not None else 0)
        return total

    got = _run(given, why, tensor_parallel)
    whole = torch.nn.functional.silu(x @ w1.T + (b1 if b1 is not None else 0)) @ w2.T + (b2 if b2 is not None else 0)
    _close(got, whole, given, why, lambda o: "one sum of the ranks' partial outputs, the bias added once")


# ----------------------------------------------------------------------------------------- column_shard


@column_shard.case
def column_shard_example(impl: Callable) -> None:
    """The notebook's example: rank 0 holds rows 0..1 and bias [10, 20], rank 1 rows 2..3 and bias [30, 40]"""
    weight, bias = example_column()
    for rank in (0, 1):
        _weight_piece(impl, "column", weight, bias, rank, 2, "the example of the contract")
        _bias_piece(impl, "column", weight, bias, rank, 2, "the example of the contract")


@column_shard.case
def rank_r_holds_the_contiguous_output_rows_of_piece_r(impl: Callable) -> None:
    """Rank r holds the contiguous output rows r*P .. (r+1)*P - 1 (piece r), not every size-th row"""
    for size in SIZES:
        for out, inn in ((8, 6), (16, 10), (12, 4)):
            weight, bias = random_layer(out, inn, seed=out * 100 + inn + size)
            for rank in range(size):
                _weight_piece(impl, "column", weight, bias, rank, size, "a column-parallel layer splits its outputs; "
                              "the input columns, here not a multiple of the size, stay whole")


@column_shard.case
def the_bias_is_split_like_the_rows(impl: Callable) -> None:
    """The bias is split like the rows: rank r holds the bias of its own outputs; no bias gives None"""
    for size in SIZES:
        weight, bias = random_layer(8, 6, seed=31 + size)
        for rank in range(size):
            _bias_piece(impl, "column", weight, bias, rank, size, "each rank adds the bias of the outputs it computes")
            _bias_piece(impl, "column", weight, None, rank, size, "a layer without a bias")


@column_shard.case
def the_ranks_outputs_concatenated_in_rank_order_are_the_whole_layers(impl: Callable) -> None:
    """The ranks' outputs, concatenated along the last dimension in rank order, equal the whole layer's output"""
    for size in SIZES:
        for out, inn, has_bias in ((8, 6, True), (16, 12, True), (12, 5, False)):
            weight, bias = random_layer(out, inn, seed=7 * out + inn + size, bias=has_bias)
            x = _input(3, inn, seed=out + size)
            given = (f"column_shard({_shown(weight, 'matrix')}, {_shown(bias, 'vector')}, rank, size={size}) for "
                     f"rank = 0..{size - 1}, then torch.cat([x @ w_r.T{' + b_r' if has_bias else ''} for each rank], "
                     f"dim=-1), x a random 3 x {inn} input")
            pieces = _all_pieces(impl, "column_shard", weight, bias, size)
            why = "the whole layer's x @ weight.T" + (" + bias" if has_bias else "")
            def concatenated(pieces=pieces, x=x) -> torch.Tensor:
                return torch.cat([x @ w.T + (b if b is not None else 0) for w, b in pieces], -1)

            got = _run(given, why, concatenated)
            want = x @ weight.T + (bias if bias is not None else 0)
            per = out // size
            _close(got, want, given, why, lambda o, per=per: f"output {o} is rank {o // per}'s, its row {o % per}")


@column_shard.case
def a_column_parallel_layer_feeding_a_row_parallel_one_needs_one_sum(impl: Callable) -> None:
    """A column-parallel layer feeding a row-parallel one (through silu) needs ONE sum, at the end"""
    for size in SIZES:
        _two_layers(impl, reference_row, size, hidden=8, inter=16, seed=50 + size)
        _two_layers(impl, reference_row, size, hidden=6, inter=12, seed=60 + size, bias=False)


@column_shard.case
def a_size_that_does_not_divide_the_outputs_is_refused(impl: Callable) -> None:
    """A size that does not divide out_features is refused with ValueError (the ranks hold equal pieces)"""
    for out, inn, size in ((6, 8, 4), (9, 4, 2), (4, 6, 3), (10, 12, 4)):
        weight, bias = random_layer(out, inn, seed=out + inn)
        for rank in (0, size - 1):
            expect_raises(ValueError, f"{_given('column_shard', weight, bias, rank, size)}: {out} outputs do not "
                          f"split into {size} equal pieces", impl, weight.clone(), bias.clone(), rank, size)


@column_shard.case
def the_layer_is_left_unchanged(impl: Callable) -> None:
    """The weight and the bias are left unchanged (returning views of them is fine)"""
    weight, bias = random_layer(8, 6, seed=77)
    for size in SIZES:
        for rank in range(size):
            given = _given("column_shard", weight, bias, rank, size)
            mine_w, mine_b = weight.clone(), bias.clone()
            call(given, "rank's pieces", impl, mine_w, mine_b, rank, size)
            expect(torch.equal(mine_w, weight) and torch.equal(mine_b, bias), f"after {given}",
                   "the weight and the bias unchanged (the whole layer still serves other ranks)",
                   "they were modified in place")


# ----------------------------------------------------------------------------------------- row_shard


@row_shard.case
def row_shard_example(impl: Callable) -> None:
    """The notebook's example: rank 0 holds columns 0..1 and the bias, rank 1 columns 2..3 and None"""
    weight, bias = example_row()
    for rank in (0, 1):
        _weight_piece(impl, "row", weight, bias, rank, 2, "the example of the contract")
        _bias_piece(impl, "row", weight, bias, rank, 2, "the example of the contract")


@row_shard.case
def rank_r_holds_the_contiguous_input_columns_of_piece_r(impl: Callable) -> None:
    """Rank r holds the contiguous input columns r*P .. (r+1)*P - 1 (piece r) of every row, not every size-th column"""
    for size in SIZES:
        for out, inn in ((6, 8), (10, 16), (4, 12)):
            weight, bias = random_layer(out, inn, seed=out * 100 + inn + size)
            for rank in range(size):
                _weight_piece(impl, "row", weight, bias, rank, size, "a row-parallel layer splits its inputs; the "
                              "output rows, here not a multiple of the size, stay whole")


@row_shard.case
def the_bias_is_added_once_rank_0_keeps_it(impl: Callable) -> None:
    """The bias is added once, after the sum: rank 0 keeps the whole bias, every other rank gets None"""
    for size in SIZES:
        weight, bias = random_layer(6, 8, seed=41 + size)
        for rank in range(size):
            _bias_piece(impl, "row", weight, bias, rank, size, "the ranks' partial outputs are summed: a bias on "
                        "every rank would be added once per rank")
            _bias_piece(impl, "row", weight, None, rank, size, "a layer without a bias")


@row_shard.case
def the_ranks_partial_outputs_summed_are_the_whole_layers(impl: Callable) -> None:
    """The ranks' partial outputs, summed (the all-reduce), equal the whole layer's output"""
    for size in SIZES:
        for out, inn, has_bias in ((6, 8, True), (12, 16, True), (5, 12, False)):
            weight, bias = random_layer(out, inn, seed=7 * out + inn + size, bias=has_bias)
            x = _input(3, inn, seed=out + size)
            per = inn // size
            given = (f"row_shard({_shown(weight, 'matrix')}, {_shown(bias, 'vector')}, rank, size={size}) for rank = "
                     f"0..{size - 1}, then the sum over the ranks of x_r @ w_r.T (+ b_r where not None), x a random "
                     f"3 x {inn} input and x_r = x[:, r*{per} : (r+1)*{per}] rank r's slice of it")
            pieces = _all_pieces(impl, "row_shard", weight, bias, size)
            why = "the whole layer's x @ weight.T" + (" + bias, the bias added once" if has_bias else "")

            def summed(pieces=pieces, x=x, per=per) -> torch.Tensor:
                partials = [x[:, r * per:(r + 1) * per] @ w.T + (b if b is not None else 0)
                            for r, (w, b) in enumerate(pieces)]
                return torch.stack(partials).sum(0)

            got = _run(given, why, summed)
            want = x @ weight.T + (bias if bias is not None else 0)
            _close(got, want, given, why, lambda o: "the sum of every rank's partial output")


@row_shard.case
def a_row_parallel_layer_after_a_column_parallel_one_needs_one_sum(impl: Callable) -> None:
    """A row-parallel layer after a column-parallel one (through silu) needs ONE sum, at the end"""
    for size in SIZES:
        _two_layers(reference_column, impl, size, hidden=8, inter=16, seed=70 + size)
        _two_layers(reference_column, impl, size, hidden=6, inter=12, seed=80 + size, bias=False)


@row_shard.case
def a_size_that_does_not_divide_the_inputs_is_refused(impl: Callable) -> None:
    """A size that does not divide in_features is refused with ValueError (the ranks hold equal pieces)"""
    for out, inn, size in ((8, 6, 4), (4, 9, 2), (6, 4, 3), (12, 10, 4)):
        weight, bias = random_layer(out, inn, seed=out + inn)
        for rank in (0, size - 1):
            expect_raises(ValueError, f"{_given('row_shard', weight, bias, rank, size)}: {inn} inputs do not split "
                          f"into {size} equal pieces", impl, weight.clone(), bias.clone(), rank, size)


@row_shard.case
def the_row_layer_is_left_unchanged(impl: Callable) -> None:
    """The weight and the bias are left unchanged (returning views of them is fine)"""
    weight, bias = random_layer(6, 8, seed=78)
    for size in SIZES:
        for rank in range(size):
            given = _given("row_shard", weight, bias, rank, size)
            mine_w, mine_b = weight.clone(), bias.clone()
            call(given, "rank's pieces", impl, mine_w, mine_b, rank, size)
            expect(torch.equal(mine_w, weight) and torch.equal(mine_b, bias), f"after {given}",
                   "the weight and the bias unchanged (the whole layer still serves other ranks)",
                   "they were modified in place")


# ----------------------------------------------------------------------------------------- allreduce_points

KINDS = {
    "input_layernorm": "replicated", "post_attention_layernorm": "replicated", "residual_add": "replicated",
    "qkv_proj": "column", "gate_up_proj": "column",
    "rope": "local", "attention": "local", "silu_mul": "local",
    "o_proj": "row", "down_proj": "row",
}
ATTENTION = ["input_layernorm", "qkv_proj", "rope", "attention", "o_proj", "residual_add"]
MLP = ["post_attention_layernorm", "gate_up_proj", "silu_mul", "down_proj", "residual_add"]
BLOCK = ATTENTION + MLP


def reference_points(block: list[str]) -> list[int]:
    """After every row-parallel layer: its output is a partial sum."""
    return [i for i, op in enumerate(block) if KINDS[op] == "row"]


def _after(points: Any, block: list[str]) -> str:
    """'[4, 9]: after 4 o_proj, 9 down_proj'."""
    if not isinstance(points, list) or not all(isinstance(i, int) and 0 <= i < len(block) for i in points):
        return repr(points)
    if not points:
        return "[] (no all-reduce)"
    return f"{points}: after " + ", ".join(f"{i} {block[i]}" for i in points)


def _points(impl: Callable, block: list[str], why: str) -> None:
    given = f"allreduce_points({block})"
    want = reference_points(block)
    expected = f"{_after(want, block)} ({why})"
    mine = list(block)
    got = call(given, expected, impl, mine)
    got = list(got) if isinstance(got, tuple) else got
    expect(got == want, given, expected, _after(got, block))
    expect(mine == block, f"after {given}", "the block unchanged", f"it became {mine}")


@allreduce_points.case
def allreduce_points_example(impl: Callable) -> None:
    """The notebook's example: one all-reduce after o_proj (4), one after down_proj (9)"""
    _points(impl, BLOCK, "the example of the contract")


@allreduce_points.case
def a_column_parallel_layer_needs_no_allreduce_after_it(impl: Callable) -> None:
    """A column-parallel layer writes whole values of the rank's own outputs: no all-reduce after it"""
    _points(impl, BLOCK, "qkv_proj and gate_up_proj give each rank its own heads and rows, final already; rope, "
            "attention and silu_mul work on them locally")
    _points(impl, ["input_layernorm", "qkv_proj", "attention", "o_proj", "residual_add"], "an attention sublayer "
            "without rope: only o_proj leaves partial sums")


@allreduce_points.case
def a_row_parallel_layer_leaves_partial_sums(impl: Callable) -> None:
    """A row-parallel layer leaves partial sums: an all-reduce right after each one"""
    _points(impl, MLP, "an MLP sublayer alone: down_proj's output is a partial sum")
    _points(impl, ["post_attention_layernorm", "gate_up_proj", "silu_mul", "down_proj"], "an MLP that ends with "
            "down_proj: its partial sums still need the all-reduce")
    _points(impl, ["o_proj"], "a row-parallel layer alone")


@allreduce_points.case
def the_sum_comes_before_the_residual_add(impl: Callable) -> None:
    """The sum comes before the residual add, not after it: each rank adding the residual counts it size times"""
    _points(impl, BLOCK, "residual_add is replicated: it must see the summed values")
    _points(impl, ATTENTION + ["post_attention_layernorm"], "the attention sublayer, then the next norm")


@allreduce_points.case
def two_blocks_two_allreduces_each(impl: Callable) -> None:
    """Two blocks: two all-reduces per block, at the second block's own positions in the list"""
    _points(impl, BLOCK + BLOCK, "the second block's o_proj is at 15, its down_proj at 20")
    _points(impl, BLOCK + BLOCK + BLOCK, "three blocks")


@allreduce_points.case
def a_block_whose_mlp_comes_first(impl: Callable) -> None:
    """Any order: a block whose MLP runs before its attention still sums after down_proj and after o_proj"""
    _points(impl, MLP + ATTENTION, "the MLP first: down_proj at 3, o_proj at 9")
    _points(impl, MLP + MLP + ATTENTION, "two MLPs, then attention")


@allreduce_points.case
def an_empty_block_needs_no_allreduce(impl: Callable) -> None:
    """An empty block, or one with no row-parallel layer, needs no all-reduce"""
    _points(impl, [], "nothing runs")
    _points(impl, ["input_layernorm", "residual_add"], "replicated operations only")


@allreduce_points.case
def an_unknown_operation_is_refused_with_valueerror(impl: Callable) -> None:
    """An operation not in OP_KINDS is refused with ValueError"""
    for block, what in ((BLOCK[:4] + ["lm_head"] + BLOCK[4:], "lm_head, which the table does not list"),
                        (["input_layernorm", "qkv_proj", "attention", "out_proj", "residual_add"], "out_proj, "
                         "another model's name for o_proj"),
                        (["dropout"], "dropout alone")):
        expect_raises(ValueError, f"allreduce_points({block}): {what}", impl, list(block))


@allreduce_points.case
def random_stacks_of_sublayers(impl: Callable) -> None:
    """Random stacks of attention and MLP sublayers: an all-reduce after every row-parallel layer"""
    rng = random.Random(13)
    for _ in range(30):
        block: list[str] = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.5:
                sub = list(ATTENTION)
                if rng.random() < 0.3:
                    sub.remove("rope")
            else:
                sub = list(MLP)
            block += sub
        _points(impl, block, "after each o_proj and each down_proj")


# ----------------------------------------------------------------------------------------- allreduce_bytes


def reference_bytes(num_tokens: int, hidden_size: int, dtype_bytes: int, num_layers: int) -> int:
    return 2 * num_layers * num_tokens * hidden_size * dtype_bytes


def _bytes(impl: Callable, num_tokens: int, hidden_size: int, dtype_bytes: int, num_layers: int, why: str) -> None:
    given = (f"allreduce_bytes(num_tokens={num_tokens}, hidden_size={hidden_size}, dtype_bytes={dtype_bytes}, "
             f"num_layers={num_layers})")
    want = reference_bytes(num_tokens, hidden_size, dtype_bytes, num_layers)
    plural = lambda n, word: f"{n} {word}" + ("s" if n != 1 else "")  # noqa: E731
    expected = (f"{want} ({why}: 2 all-reduces per layer x {plural(num_layers, 'layer')} x "
                f"{plural(num_tokens, 'token')} x {hidden_size} numbers x {plural(dtype_bytes, 'byte')})")
    got = call(given, expected, impl, num_tokens, hidden_size, dtype_bytes, num_layers)
    if isinstance(got, int) and not isinstance(got, bool):
        shown = f"{got}" + (f" ({got / want:.4g} times as much)" if got != want and want else "")
    else:
        shown = f"{got!r} (an int is expected)"
    expect(isinstance(got, int) and not isinstance(got, bool) and got == want, given, expected, shown)


@allreduce_bytes.case
def allreduce_bytes_example(impl: Callable) -> None:
    """The notebook's examples: 524288 bytes for one Llama-3-8B token, 1638400 for the shipped model over 100 tokens"""
    _bytes(impl, 1, 4096, 2, 32, "Llama-3-8B in bf16, one decode token")
    _bytes(impl, 2000, 4096, 2, 32, "Llama-3-8B in bf16, a prefill of 2000 tokens")
    _bytes(impl, 100, 256, 4, 8, "the shipped model in float32")


def _scales(impl: Callable, base: tuple[int, int, int, int], field: str, factor: int, why: str) -> None:
    """One rule alone: multiplying one argument by `factor` must multiply the bytes by exactly `factor` — true of a
    count with any other mistake, so only this argument's own rule fails when it is mishandled."""
    names = ("num_tokens", "hidden_size", "dtype_bytes", "num_layers")
    index = names.index(field)
    bigger = tuple(v * factor if i == index else v for i, v in enumerate(base))
    given = (f"allreduce_bytes({', '.join(f'{n}={v}' for n, v in zip(names, base))}), then with {field}={bigger[index]}"
             f" ({factor} times as many)")
    expected = f"{factor} times the bytes ({why})"
    small = call(given, expected, impl, *base)
    large = call(given, expected, impl, *bigger)
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (small, large))
    ok = ints and small > 0 and large == factor * small
    if not ints:
        shown = f"{small!r}, then {large!r} (an int is expected)"
    else:
        shown = f"{small}, then {large}" + (f" ({large / small:.4g} times)" if small else "")
    expect(ok, given, expected, shown)


@allreduce_bytes.case
def two_allreduces_per_layer(impl: Callable) -> None:
    """Two all-reduces per layer, after o_proj and after down_proj: not one, not one per linear layer"""
    for tokens, hidden, dtype in ((1, 1024, 1), (1, 4096, 1)):  # one token of 1-byte numbers: those rules are others
        given = (f"allreduce_bytes(num_tokens={tokens}, hidden_size={hidden}, dtype_bytes={dtype}, num_layers=1), "
                 "then with num_layers=2")
        want = 2 * tokens * hidden * dtype
        expected = (f"{want} bytes more for the second layer (its two all-reduces, each {tokens} x {hidden} numbers "
                    f"of {dtype} byte)")
        one, two = call(given, expected, impl, tokens, hidden, dtype, 1), call(given, expected, impl, tokens, hidden,
                                                                                  dtype, 2)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (one, two))
        ok = ints and two - one == want
        shown = f"{two - one} more ({(two - one) / want:.4g} times as much)" if ints else \
            f"{one!r}, then {two!r} (an int is expected)"
        expect(ok, given, expected, shown)


@allreduce_bytes.case
def each_allreduce_carries_every_tokens_hidden_state(impl: Callable) -> None:
    """Each all-reduce carries every token's hidden state: num_tokens * hidden_size numbers"""
    _scales(impl, (64, 2048, 2, 16), "num_tokens", 8, "a prefill of 512 tokens against a decode step of 64")
    _scales(impl, (64, 1024, 2, 16), "hidden_size", 4, "each token's whole hidden state")


@allreduce_bytes.case
def bytes_not_numbers(impl: Callable) -> None:
    """Bytes, not numbers: each number takes dtype_bytes bytes"""
    _scales(impl, (100, 256, 1, 8), "dtype_bytes", 4, "float32 numbers take 4 bytes, 8-bit ones 1")


@allreduce_bytes.case
def the_decoder_blocks_allreduces_only(impl: Callable) -> None:
    """The decoder blocks' all-reduces only: not the embedding's, nor the gathering of the logits"""
    _scales(impl, (7, 3, 2, 1), "num_layers", 2, "with nothing outside the blocks counted, twice the layers is "
            "twice the bytes (an embedding's all-reduce would be counted once)")


@allreduce_bytes.case
def random_models_and_token_counts(impl: Callable) -> None:
    """Random models and token counts: 2 x num_layers x num_tokens x hidden_size x dtype_bytes"""
    rng = random.Random(14)
    for _ in range(30):
        _bytes(impl, rng.choice([1, 7, 64, 333, 4096]), rng.choice([256, 896, 2048, 4096, 5120, 8192]),
               rng.choice([1, 2, 4]), rng.choice([1, 8, 24, 28, 32, 80]), "as the contract counts it")
