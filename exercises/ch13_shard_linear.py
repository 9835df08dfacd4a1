"""Chapter 13 exercises `ch13.column_shard` and `ch13.row_shard`: the piece of a linear layer's weight
and bias that one rank of a tensor-parallel group holds (Megatron-LM's split)."""

import torch


def column_shard(weight: torch.Tensor, bias: torch.Tensor | None, rank: int,
                 size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank `rank`'s piece of a column-parallel linear layer: a share of its OUTPUTS.

    weight: (out_features, in_features), as nn.Linear holds it (row o: the in_features weights of output o).
    bias: (out_features,), or None for a layer without one. rank: 0 <= rank < size. size: the number of ranks.
    The out_features outputs are cut into `size` equal, contiguous pieces of P = out_features // size rows;
    rank r holds piece r, the rows r*P .. (r+1)*P - 1 (not every size-th row), and the same entries of the bias:
        weight_piece = weight[r*P : (r+1)*P, :]        shape (P, in_features)
        bias_piece   = bias[r*P : (r+1)*P]             shape (P,); None when bias is None
    Each rank then computes x @ weight_piece.T + bias_piece from the WHOLE input x: the outputs of the
    ranks, concatenated along the last dimension in rank order, equal the whole layer's output
    x @ weight.T + bias, with no communication.
    Return (weight_piece, bias_piece), of the inputs' dtype. Slices that share the inputs' memory (views) are
    fine, so are copies; do not modify weight or bias.
    Example: weight [[0, 1], [2, 3], [4, 5], [6, 7]], bias [10, 20, 30, 40], size 2 ->
    rank 0: ([[0, 1], [2, 3]], [10, 20]); rank 1: ([[4, 5], [6, 7]], [30, 40]).
    Errors: ValueError when size does not divide out_features (the ranks must hold equal pieces).
    """
    raise NotImplementedError("ch13.column_shard: rank r's contiguous share of the output rows, and of the bias")


def row_shard(weight: torch.Tensor, bias: torch.Tensor | None, rank: int,
              size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank `rank`'s piece of a row-parallel linear layer: a share of its INPUTS.

    weight: (out_features, in_features), as nn.Linear holds it. bias: (out_features,), or None.
    rank: 0 <= rank < size. size: the number of ranks.
    The in_features inputs are cut into `size` equal, contiguous pieces of P = in_features // size columns;
    rank r holds piece r, the columns r*P .. (r+1)*P - 1 of every row:
        weight_piece = weight[:, r*P : (r+1)*P]        shape (out_features, P)
    Rank r sees only x_r = x[..., r*P : (r+1)*P], its slice of the input (what a column-parallel layer before
    it produced), and computes the PARTIAL output x_r @ weight_piece.T. Summing the ranks' partial outputs
    (the all-reduce) gives x @ weight.T. The bias must be added exactly once, after the sum: rank 0 keeps
    the whole bias (and adds it to its partial output), every other rank gets None:
        bias_piece   = bias (all out_features entries) on rank 0; None on every other rank, and None
                       on every rank when bias is None
    so that sum over r of (x_r @ weight_piece_r.T [+ bias on rank 0]) = x @ weight.T + bias.
    Return (weight_piece, bias_piece), of the inputs' dtype. Views of the inputs are fine, so are copies;
    do not modify weight or bias.
    Example: weight [[0, 1, 2, 3], [4, 5, 6, 7]], bias [10, 20], size 2 ->
    rank 0: ([[0, 1], [4, 5]], [10, 20]); rank 1: ([[2, 3], [6, 7]], None).
    Errors: ValueError when size does not divide in_features.
    """
    raise NotImplementedError("ch13.row_shard: rank r's contiguous share of the input columns; the bias on rank 0 only")
