"""The embedding split by vocabulary rows across the ranks of a tensor-parallel group.

Rank r holds rows [start, start + per_rank) of the table. Each rank looks up the tokens that fall in
its range and writes zeros for the others; one all-reduce (a sum in which exactly one rank gave
each token's row) leaves every rank with the whole embedding:

    ids:       [  5,  900,   17 ]          vocabulary 1024, two ranks of 512 rows
    rank 0:    [ e5,    0,  e17 ]
    rank 1:    [  0, e900,    0 ]
    all-reduce [ e5, e900,  e17 ]          on both ranks
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from minillm.distributed.communicator import Communicator


class VocabParallelEmbedding(nn.Module):
    def __init__(self, rows: range, hidden_size: int, communicator: Communicator):
        super().__init__()
        self.start, self.stop = rows.start, rows.stop
        self.weight = nn.Parameter(torch.empty(len(rows), hidden_size))
        self.communicator = communicator

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(num_tokens,) -> (num_tokens, hidden), the same on every rank."""
        mine = (input_ids >= self.start) & (input_ids < self.stop)  # (num_tokens,)
        local = torch.where(mine, input_ids - self.start, 0)
        x = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)  # (num_tokens, hidden)
        return self.communicator.all_reduce_(x)
