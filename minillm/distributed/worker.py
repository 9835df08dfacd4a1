"""A tensor-parallel worker process: one rank's shard of the model and of the KV cache, nothing else.

    python -m minillm.distributed.worker INBOX_FD OUTBOX_FD      (started by the engine: executor.py)

It schedules nothing and samples nothing. Each `RunStep` it receives is the step rank 0 is about to
run: it makes the same copies in its own cache, runs the same forward pass over its heads and rows —
meeting the other ranks in every all-reduce — and sends its share of the logits to rank 0.

It ends when told (`Shutdown`), and on its own when rank 0 is gone: its pipe closes (EOF), its parent
changes, or a collective fails because a peer's connection closed. An error of its own is sent to
rank 0 (`WorkerFailed`) before it exits, so the engine can say what went wrong.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from multiprocessing.connection import Connection

import torch

from minillm.distributed.communicator import Communicator, make_group
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
from minillm.runner import forward_logits

IDLE_POLL_S = 0.5  # how often an idle worker checks that rank 0 is still its parent


def main(inbox_fd: int, outbox_fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's: it shuts the workers down
    inbox, outbox = Connection(inbox_fd, writable=False), Connection(outbox_fd, readable=False)
    try:
        start: StartWorker = inbox.recv()
    except (EOFError, OSError):
        return
    try:
        serve(start, inbox, outbox)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # rank 0 is gone
        _remove_weights(start.weights)
    except Exception as err:  # said to rank 0 (which may be gone too), then the worker ends
        with contextlib.suppress(OSError):
            outbox.send(WorkerFailed(start.rank, f"{type(err).__name__}: {err}"))
        if os.getppid() != start.parent_pid:  # gone: meeting it failed (its store closed)
            _remove_weights(start.weights)
        sys.exit(1)


def _remove_weights(weights: str) -> None:
    """Rank 0 deletes the whole model's file once every worker has loaded its shard; if rank 0 died before that
    (killed while the workers loaded: the OOM killer's choice when a model is large), nobody else would — and in
    /dev/shm it holds a copy of the model in memory until the machine restarts."""
    folder = os.path.dirname(weights)
    if os.path.basename(folder).startswith("minillm-tp-"):  # only what the executor made
        shutil.rmtree(folder, ignore_errors=True)


def serve(start: StartWorker, inbox: Connection, outbox: Connection) -> None:
    torch.set_num_threads(start.threads)
    device = torch.device(start.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    communicator = Communicator(None, start.rank, start.size)
    from safetensors import safe_open

    with safe_open(start.weights, framework="pt", device="cpu") as weights:  # lazily: only this rank's slices
        model = build_shard(start.model_config, communicator, weights.get_slice, getattr(torch, start.dtype),
                            device)
    if start.quantization is not None:
        from minillm.quantization.model import quantize_model

        model = quantize_model(model, start.quantization, start.quantization_group_size)
    outbox.send(WorkerLoaded(start.rank))
    communicator.group = make_group(start.rank, start.size, "127.0.0.1", start.store_port, device)
    message = inbox.recv()
    if not isinstance(message, BuildCache):
        return
    cache = message.spec.build(model.shard_config, model.dtype, device)
    outbox.send(WorkerReady(start.rank))
    while True:
        while not inbox.poll(IDLE_POLL_S):
            if os.getppid() != start.parent_pid:
                return
        message = inbox.recv()
        if isinstance(message, RunStep):
            run_step(model, cache, communicator, message)
        elif isinstance(message, Drain):
            totals = {kind: (t.count, t.nbytes, t.seconds) for kind, t in communicator.totals.items()}
            outbox.send(Drained(start.rank, communicator.drain(), totals))
        elif isinstance(message, Shutdown):
            return


@torch.inference_mode()
def run_step(model, cache, communicator: Communicator, step: RunStep) -> None:
    """The step rank 0 runs, on this rank's shard: copies first, then the pass and this rank's logits."""
    began = time.perf_counter()
    if step.block_copies:
        cache.copy_blocks(list(step.block_copies))
    if step.slot_copies:
        cache.copy_slots(list(step.slot_copies))
    if step.chunks:
        forward_logits(model, cache, step.chunks, list(step.logit_rows))
    communicator.record_step(began, time.perf_counter())


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
