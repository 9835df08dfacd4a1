"""Rank 0's side of tensor parallelism: start the workers, tell them each step, notice when one is gone.

    engine process = rank 0                            worker processes = ranks 1..N-1
    ┌──────────────────────────────────────┐            ┌──────────────────────────────┐
    │ scheduler → SchedulerOutput          │  RunStep   │                              │
    │ runner: RunStep to every worker ─────┼──(pipe)───►│ the same copies and chunks   │
    │         forward on rank 0's shard ◄──┼─all-reduce─┼─► forward on its shard       │
    │         logits (all columns) ◄───────┼──gather────┼── its vocabulary's columns   │
    │         sample, update requests      │            │ (samples nothing)            │
    └──────────────────────────────────────┘            └──────────────────────────────┘

vLLM's executor/worker shape: the scheduler runs once and sends each step's plan; the workers hold
shards of the weights and of the KV cache, and compute. Workers are fresh interpreters
(`python -m minillm.distributed.worker`), like the engine core of chapter 10, so a script needs no
`if __name__ == "__main__"` guard. The whole model is written once to a safetensors file (in shared
memory where the system has it) from which each worker reads only its slices, then deleted.

All ranks run on this machine (gloo over loopback on CPUs; NCCL on CUDA, rank r on GPU r). Several
machines would start the workers with `torchrun` instead, meet at a store on rank 0's address, and
need a control channel other than a pipe — chapter 13 says what changes.

A worker that dies ends the engine: a collective waiting for it fails at once (gloo sees the
connection close), a step sent to it fails on its closed pipe, and the engine stops with the
worker's exit code or its own error. Every worker ends with the engine: told to (`close()`, or
when the engine is garbage-collected), or on its own when rank 0 goes away.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from minillm.attention.cache_spec import CacheSpec
from minillm.distributed.communicator import COLLECTIVE_TIMEOUT_S, Collective, Communicator, make_group
from minillm.distributed.messages import (
    BuildCache,
    Drain,
    Drained,
    RunStep,
    Shutdown,
    StartWorker,
    WorkerFailed,
    WorkerLoaded,
    WorkerReady,
)
from minillm.distributed.shard_model import build_shard
from minillm.distributed.sharding import check_shardable
from minillm.model.decoder import CausalLM
from minillm.scheduler.output import ScheduledChunk

START_TIMEOUT_S = 300.0  # loading a shard: longer means the worker is stuck
POLL_S = 0.05


class WorkerLost(RuntimeError):
    """A tensor-parallel worker exited or failed: the engine cannot step any more."""


class TensorParallelWorkers:
    """Ranks 1..size-1 in processes of their own, and rank 0's shard of `model` (`.model`) in this one."""

    def __init__(self, model: CausalLM, size: int, quantization: str | None = None, quantization_group_size: int = 64):
        if getattr(model, "quantization", None) is not None:
            raise ValueError("tensor parallelism quantizes each rank's shard itself: pass the float model and set "
                             "EngineConfig(quantization=...)")
        if model.communicator is not None:
            raise ValueError("the model is a tensor-parallel shard already: pass the whole model")
        check_shardable(model.config, size, quantization, quantization_group_size)  # before any process starts
        self.size = size
        device = model.device
        self.devices = [device] + [self._device(device, rank) for rank in range(1, size)]
        threads = max(1, _cores() // size)  # the ranks share this machine's cores
        store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=_timeout(), wait_for_workers=False)
        self._weights_dir = tempfile.mkdtemp(prefix="minillm-tp-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                             else None)
        self.processes: list[subprocess.Popen] = []
        self.inboxes: list[Connection] = []  # rank 0 -> worker r is inboxes[r - 1]
        self.outboxes: list[Connection] = []
        self._links = _Links(store=store)  # the group meets through the store: kept while the group lives
        _THREADS.claim(threads)
        self._finalizer = weakref.finalize(self, _stop_workers, self.processes, self.inboxes, self.outboxes,
                                           self._links, self._weights_dir)
        try:
            state = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
            weights = os.path.join(self._weights_dir, "model.safetensors")
            from safetensors.torch import save_file

            save_file(state, weights)
            for rank in range(1, size):
                self._spawn(StartWorker(rank, size, store.port, weights, model.config, str(model.dtype).split(".")[-1],
                                        str(self.devices[rank]), threads, os.getpid(), quantization,
                                        quantization_group_size))
            self._await_all(WorkerLoaded, "loading its shard")
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            self.communicator = Communicator(None, 0, size)
            shard = build_shard(model.config, self.communicator, state.__getitem__, model.dtype, device)
            del state
            self.communicator.group = make_group(0, size, "127.0.0.1", store.port, device, store=store)
            self._links.communicator = self.communicator
        except BaseException:
            self.close()
            raise
        self.model = shard
        self._step_start: float | None = None

    @staticmethod
    def _device(device: torch.device, rank: int) -> torch.device:
        if device.type != "cuda":
            return device
        index = (device.index or 0) + rank
        if index >= torch.cuda.device_count():
            raise ValueError(f"tensor parallelism puts rank {rank} on cuda:{index}, and this machine has "
                             f"{torch.cuda.device_count()} GPU(s)")
        return torch.device("cuda", index)

    def _spawn(self, start: StartWorker) -> None:
        inbox, to_worker = Pipe(duplex=False)
        from_worker, outbox = Pipe(duplex=False)
        process = subprocess.Popen([sys.executable, "-m", "minillm.distributed.worker", str(inbox.fileno()),
                                    str(outbox.fileno())], pass_fds=(inbox.fileno(), outbox.fileno()))
        inbox.close()  # the worker's ends: once it exits, reading from it ends (EOF) instead of waiting forever
        outbox.close()
        self.processes.append(process)
        self.inboxes.append(to_worker)
        self.outboxes.append(from_worker)
        to_worker.send(start)

    def _await_all(self, kind: type, doing: str) -> None:
        """Wait for every worker's `kind` message; a worker failing or exiting meanwhile raises its reason."""
        waiting = set(range(1, self.size))
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            for rank in sorted(waiting):
                outbox = self.outboxes[rank - 1]
                if outbox.poll(0):
                    try:
                        message = outbox.recv()
                    except EOFError:
                        raise WorkerLost(f"tensor-parallel worker {rank} exited while {doing} "
                                         f"({_exit(self.processes[rank - 1])})") from None
                    if isinstance(message, WorkerFailed):
                        raise WorkerLost(f"tensor-parallel worker {rank} failed while {doing}: {message.error}")
                    if isinstance(message, kind):
                        waiting.discard(rank)
                elif self.processes[rank - 1].poll() is not None:
                    raise WorkerLost(f"tensor-parallel worker {rank} exited while {doing} "
                                     f"({_exit(self.processes[rank - 1])})")
            if waiting:
                if time.monotonic() > deadline:
                    raise WorkerLost(f"tensor-parallel workers {sorted(waiting)} took over {START_TIMEOUT_S:.0f} s "
                                     f"{doing}")
                time.sleep(POLL_S)

    def build_caches(self, spec: CacheSpec) -> None:
        """Every worker builds its shard of the cache rank 0 built (the same blocks or slots)."""
        for inbox in self.inboxes:
            inbox.send(BuildCache(spec))
        self._await_all(WorkerReady, "building its KV cache")

    # ------------------------------------------------------------------ each step
    def run_step(self, block_copies: tuple, slot_copies: tuple, chunks: tuple[ScheduledChunk, ...],
                 logit_rows: list[int]) -> None:
        """Tell every worker the step rank 0 is about to run (one pickled message for all). Rank 0's step span
        starts here: its time sending the plan counts as its compute in a replay."""
        self._step_start = time.perf_counter()
        payload = pickle.dumps(RunStep(block_copies, slot_copies, chunks, tuple(logit_rows)),
                               protocol=pickle.HIGHEST_PROTOCOL)
        for inbox in self.inboxes:
            try:
                inbox.send_bytes(payload)
            except OSError as err:  # its end is closed: it has exited
                raise WorkerLost(self.failure(err)) from None

    def step_finished(self) -> None:
        """Rank 0's forward pass is over: its span, for the replay."""
        if self._step_start is not None:
            self.communicator.record_step(self._step_start, time.perf_counter())
            self._step_start = None

    # ------------------------------------------------------------------ health and records
    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def failure(self, err: BaseException | None = None) -> str:
        """What went wrong, in words: the workers that exited (and how), or failed (and why), else `err`."""
        deadline = time.monotonic() + 2.0  # a worker whose collective failed is exiting: give it a moment
        while self.alive() and time.monotonic() < deadline and err is not None and "closed" in str(err).lower():
            time.sleep(POLL_S)
        reasons = []
        for rank, (process, outbox) in enumerate(zip(self.processes, self.outboxes), start=1):
            said = None
            try:
                while outbox.poll(0):
                    message = outbox.recv()
                    if isinstance(message, WorkerFailed):
                        said = message.error
            except (EOFError, OSError):
                pass
            if said is not None:
                reasons.append(f"tensor-parallel worker {rank} failed: {said}")
            elif process.poll() is not None:
                reasons.append(f"tensor-parallel worker {rank} (pid {process.pid}) exited ({_exit(process)})")
        if reasons:
            return "; ".join(reasons)
        return f"a tensor-parallel step failed: {type(err).__name__}: {err}" if err is not None else \
            "a tensor-parallel worker is gone"

    def drain(self) -> dict[int, list[Collective]]:
        """Each rank's recorded steps and collectives since the last drain (call it between steps)."""
        records = {0: self.communicator.drain()}
        for inbox in self.inboxes:
            inbox.send(Drain())
        for rank, outbox in enumerate(self.outboxes, start=1):
            if not outbox.poll(COLLECTIVE_TIMEOUT_S):
                raise WorkerLost(f"tensor-parallel worker {rank} did not answer")
            message = outbox.recv()
            if isinstance(message, WorkerFailed):
                raise WorkerLost(f"tensor-parallel worker {rank} failed: {message.error}")
            if isinstance(message, Drained):
                records[message.rank] = message.records
        return records

    def close(self) -> None:
        """Stop every worker (waiting a moment for each, then killing it), let go of the group's sockets and give
        this process its threads back."""
        self._finalizer()


@dataclass
class _Links:
    """What ties rank 0 to its workers besides their processes and pipes: the process group and the store it met
    through. Cut when the workers stop — their sockets close, so a closed engine kept alive (a notebook's variable)
    holds no file descriptors, and a worker stuck in a collective (rank 0's step failed half-way) sees its peer
    leave and exits at once instead of waiting out the timeout until it is killed."""

    store: dist.Store | None = None
    communicator: Communicator | None = None

    def cut(self) -> None:
        if self.communicator is not None:
            self.communicator.group = None  # its only reference: the group is destroyed, its connections closed
        self.communicator = self.store = None


class _ThreadShare:
    """This process's torch threads while tensor-parallel groups live in it: the first group to start saves the
    count and each sets its share of the cores; the last to stop gives the saved count back — whichever order
    several engines close in (each giving back what it found would leave the second one's cut in place)."""

    def __init__(self) -> None:
        self.live, self.saved = 0, 1

    def claim(self, threads: int) -> None:
        if self.live == 0:
            self.saved = torch.get_num_threads()
        self.live += 1
        torch.set_num_threads(threads)

    def release(self) -> None:
        self.live -= 1
        if self.live == 0:
            torch.set_num_threads(self.saved)


_THREADS = _ThreadShare()


def _stop_workers(processes: list[subprocess.Popen], inboxes: list[Connection], outboxes: list[Connection],
                  links: _Links, weights_dir: str) -> None:
    for inbox in inboxes:
        with contextlib.suppress(OSError):  # exited already
            inbox.send(Shutdown())
    links.cut()  # after the Shutdowns: an idle worker reads its own before it could notice the group go
    deadline = time.monotonic() + 5.0
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    for connection in inboxes + outboxes:
        connection.close()
    shutil.rmtree(weights_dir, ignore_errors=True)
    _THREADS.release()


def _exit(process: subprocess.Popen) -> str:
    try:
        code = process.wait(1)
    except subprocess.TimeoutExpired:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _timeout():
    import datetime

    return datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
