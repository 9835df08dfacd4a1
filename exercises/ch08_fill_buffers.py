"""Chapter 8 exercise `ch08.fill`: copy a padded batch into a recorded step's static buffers."""

import torch


def fill_buffers(buffers: dict[str, torch.Tensor], batch: dict[str, list]) -> None:
    """Copy each list of `batch` into the buffer of the same name, in place.

    buffers: "input_ids", "positions", "slot_mapping", "context_lens" of shape (rows,) and "block_tables"
    of shape (rows, width) — the tensors a recorded step reads, by address. batch: the same names, as
    lists (what `pad_to_bucket` returns). After the call every buffer holds its list's values, and is
    still the *same tensor* at the same address, with its dtype and shape: a replay reads only those
    addresses. Raise ValueError, changing nothing, if a list's shape differs from its buffer's (a batch
    for another bucket must never be broadcast into this one's rows). Return nothing.
    """
    raise NotImplementedError("ch08.fill: copy every list into its buffer without replacing the buffer")
