"""What rank 0 (the engine) and its tensor-parallel workers tell each other over their pipes.

Tensors travel through the collectives (minillm/distributed/communicator.py); the pipes carry only
small control messages, so an idle worker waits on its pipe — and sees rank 0 go away (EOF) —
instead of sitting in a collective that would time out.

Rank 0 → worker: `StartWorker` once, `BuildCache` once, then `RunStep` per step, `Drain`, `Shutdown`.
Worker → rank 0: `WorkerLoaded`, `WorkerReady` (or `WorkerFailed` at any point), `Drained` per `Drain`.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.attention.cache_spec import CacheSpec
from minillm.distributed.communicator import Collective
from minillm.model.config import ModelConfig
from minillm.scheduler.output import ScheduledChunk


@dataclass(frozen=True)
class StartWorker:
    rank: int
    size: int
    store_port: int  # rank 0's TCP store on 127.0.0.1: where the group meets
    weights: str  # a safetensors file of the whole model: each rank reads only its slices
    model_config: ModelConfig
    dtype: str  # "float32" | "float16" | "bfloat16"
    device: str  # "cpu" | "cuda:N"
    threads: int  # torch threads for this rank
    parent_pid: int  # the worker ends when this is no longer its parent
    quantization: str | None = None  # each rank quantizes its own shard (chapter 12)
    quantization_group_size: int = 64


@dataclass(frozen=True)
class WorkerLoaded:
    """The shard's weights are read; the worker now joins the group."""

    rank: int


@dataclass(frozen=True)
class BuildCache:
    spec: CacheSpec


@dataclass(frozen=True)
class WorkerReady:
    rank: int


@dataclass(frozen=True)
class WorkerFailed:
    rank: int
    error: str  # the exception's type and text


@dataclass(frozen=True)
class RunStep:
    """One step, as the scheduler planned it: the copies before the pass, the chunks, and which hidden rows
    go through the LM head (the rows rank 0 samples from, and the prompt rows whose logprobs were asked)."""

    block_copies: tuple[tuple[int, int], ...]
    slot_copies: tuple[tuple[int, int, int], ...]
    chunks: tuple[ScheduledChunk, ...]
    logit_rows: tuple[int, ...]


@dataclass(frozen=True)
class Drain:
    """Send back the collectives and steps recorded since the last drain."""


@dataclass(frozen=True)
class Drained:
    rank: int
    records: list[Collective]
    totals: dict[str, tuple[int, int, float]]  # kind -> (count, bytes, seconds) since the worker started


@dataclass(frozen=True)
class Shutdown:
    pass
