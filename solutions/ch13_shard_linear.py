"""Solution of `ch13.column_shard` and `ch13.row_shard`."""


def _piece(length, rank, size, what):
    if length % size:
        raise ValueError(f"{size} ranks cannot share {length} {what} equally")
    per = length // size
    return slice(rank * per, (rank + 1) * per)  # contiguous: rank r holds piece r


def column_shard(weight, bias, rank, size):
    rows = _piece(weight.shape[0], rank, size, "output rows")
    return weight[rows], None if bias is None else bias[rows]


def row_shard(weight, bias, rank, size):
    columns = _piece(weight.shape[1], rank, size, "input columns")
    return weight[:, columns], bias if rank == 0 else None  # added once, after the sum
