"""What one engine step launches, from torch.profiler (chapter 8).

    eager step      |linear|mul|roll|add|...|linear|...      ~hundreds of operators, each dispatched
                                                              from Python (CPU) or launched as a kernel (GPU)
    compiled step   |==== Torch-Compiled Region ====|         a few calls: fused loops, pre-packed matmuls
    CUDA Graph      |cudaGraphLaunch|                         one launch; the GPU replays every kernel

A `StepProfile` keeps the *top-level* events of the host's timeline (an operator called inside
another, `aten::addmm` inside `aten::linear`, belongs to its caller's bar; a compiled region is
replaced by the calls it still makes) and, on a GPU, the kernels the device ran. Saved as JSON, it
is what `widgets/launch_timeline.py` draws.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


@dataclass(frozen=True)
class Span:
    name: str
    start_us: float  # since the step began
    duration_us: float


@dataclass
class StepProfile:
    label: str  # e.g. "eager, batch 1"
    wall_us: float  # the step, start to end
    host: list[Span] = field(default_factory=list)  # top-level operators / runtime calls on the CPU
    device: list[Span] = field(default_factory=list)  # GPU kernels (empty on a CPU)
    compiled: list[Span] = field(default_factory=list)  # torch.compile'd regions (their calls are in `host`)

    @property
    def num_host_ops(self) -> int:
        return len(self.host)

    @property
    def num_kernels(self) -> int:
        return len(self.device)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> StepProfile:
        return cls(data["label"], data["wall_us"], *([Span(**s) for s in data[key]]
                                                      for key in ("host", "device", "compiled")))


def profile_step(run: Callable[[], object], label: str) -> StepProfile:
    """Run `run()` (one engine step) under torch.profiler; its host-side top-level events and, on
    CUDA, its kernels, with times relative to the step's start."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with _native_stderr_silenced(), profile(activities=activities) as prof, record_function("engine step"):
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.events()
    step = next(e for e in events if e.name == "engine step")
    begin = step.time_range.start

    def span(e) -> Span:
        return Span(e.name, e.time_range.start - begin, e.time_range.elapsed_us())

    def children(parent) -> list:
        return [e for e in events if e.cpu_parent is not None and e.cpu_parent.id == parent.id
                and e.device_type.name == "CPU"]

    host, regions = [], []
    for e in children(step):
        if e.name.startswith("Torch-Compiled Region"):  # what the compiled code still calls, in its place
            regions.append(span(e))
            for c in children(e):  # wrappers (guards, prologue), and the graph's calls: matmuls, attention
                calls = children(c) if c.name.startswith("## Call CompiledFxGraph") else [c]
                host.extend(span(call) for call in calls)
        else:
            host.append(span(e))
    device = [span(e) for e in events if e.device_type.name == "CUDA"]
    return StepProfile(label, step.time_range.elapsed_us(), sorted(host, key=lambda s: s.start_us),
                       sorted(device, key=lambda s: s.start_us), regions)


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """The profiler's native library logs a line to the process's stderr when it starts and stops;
    a notebook would show them under the cell. (Python's own errors are still raised.)"""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def save_profiles(profiles: list[StepProfile], path: str | Path) -> None:
    Path(path).write_text(json.dumps([p.to_json() for p in profiles]) + "\n")


def load_profiles(path: str | Path) -> list[StepProfile]:
    return [StepProfile.from_json(d) for d in json.loads(Path(path).read_text())]
