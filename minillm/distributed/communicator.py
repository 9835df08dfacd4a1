"""One rank's end of a tensor-parallel group: the two collectives the model needs, counted and timed.

    all_reduce_(x)     every rank holds a partial sum of x; afterwards every rank holds the sum
                       (after each row-parallel layer, and the vocabulary-parallel embedding)
    gather_columns(x)  every rank holds some columns (its vocabulary's logits); afterwards rank 0
                       holds them all side by side, and the others None (sampling runs on rank 0)

The group is a torch.distributed process group object — gloo on CPUs, NCCL on CUDA — made from a
TCP store, not `init_process_group`: nothing global is set, so one process can hold several engines
(a notebook running TP=1 and TP=2 side by side). Every collective is recorded (its kind, bytes and
wall-clock span on `time.perf_counter()`, one clock for every process of the machine), so a run
can be replayed rank by rank and the cost of talking measured. A collective's time includes waiting
for the slowest rank to arrive. On CUDA the spans are taken around a synchronize only when
`synchronize_timings` is set (otherwise they time the launch, not the transfer).
"""

from __future__ import annotations

import collections
import datetime
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = 60.0  # a collective waiting longer than this for a rank raises instead of hanging
RECORD_LIMIT = 20_000  # the newest collectives kept for a replay


class Collective(NamedTuple):
    kind: str  # "all-reduce" | "gather" | "step": a step's whole span on this rank (the compute around them)
    start: float  # time.perf_counter()
    end: float
    nbytes: int  # what this rank sent


@dataclass
class CollectiveTotals:
    count: int = 0
    nbytes: int = 0
    seconds: float = 0.0


def make_group(rank: int, size: int, host: str, port: int, device: torch.device,
               store: dist.Store | None = None) -> dist.ProcessGroup:
    """The group's process-group object for this rank (rank 0 passes the store it serves)."""
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if store is None:
        store = dist.TCPStore(host, port, size, False, timeout=timeout)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, size)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class Communicator:
    """The collectives of rank `rank` of `size`, through `group`, each one recorded."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, synchronize_timings: bool = False):
        self.group, self.rank, self.size = group, rank, size
        self.synchronize_timings = synchronize_timings
        self.records: collections.deque[Collective] = collections.deque(maxlen=RECORD_LIMIT)
        self.totals = {"all-reduce": CollectiveTotals(), "gather": CollectiveTotals()}

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place (it must be contiguous); returns it."""
        start = self._now(x)
        self.group.allreduce([x]).wait()
        self._record("all-reduce", start, self._now(x), x.numel() * x.element_size())
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor | None:
        """(rows, columns) from every rank -> (rows, size x columns) on rank 0, in rank order; None elsewhere."""
        x = x.contiguous()
        start = self._now(x)
        options = dist.GatherOptions()
        options.rootRank = 0
        pieces = [[torch.empty_like(x) for _ in range(self.size)]] if self.rank == 0 else []
        self.group.gather(pieces, [x], options).wait()
        self._record("gather", start, self._now(x), x.numel() * x.element_size())
        return torch.cat(pieces[0], dim=-1) if self.rank == 0 else None

    def record_step(self, start: float, end: float) -> None:
        """A step's span on this rank: what is not a collective inside it is compute."""
        self.records.append(Collective("step", start, end, 0))

    def drain(self) -> list[Collective]:
        """The records since the last drain, in the order they ended (a step's after its own collectives)."""
        records = list(self.records)
        self.records.clear()
        return records

    def _now(self, x: torch.Tensor) -> float:
        if self.synchronize_timings and x.is_cuda:
            torch.cuda.synchronize(x.device)
        return time.perf_counter()

    def _record(self, kind: str, start: float, end: float, nbytes: int) -> None:
        self.records.append(Collective(kind, start, end, nbytes))
        totals = self.totals[kind]
        totals.count += 1
        totals.nbytes += nbytes
        totals.seconds += end - start
