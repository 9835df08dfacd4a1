"""Small C kernels for the CPU, built on first use with the machine's C compiler.

    load(source) ──► ~/.cache/minillm/kernels/<name>-<hash>.so ──► ctypes.CDLL
                     (or $MINILLM_CACHE/kernels/; built once per source and shared headers
                     (minillm/csrc/), compiler, flags and CPU)

The compiler is the one torch.compile's CPU backend needs too (`cc`, `gcc`, or $CC). The kernels use
OpenMP: torch's own libgomp, already loaded, so `torch.set_num_threads` governs their threads too.
Used by minillm/attention/cpu_paged.py (decode attention) and minillm/model/fused_cpu.py (fused
elementwise operators). Anything that stops a build — no compiler, a build error, a cache folder that
cannot be written — comes back as a reason (a string), never an exception: the callers then run their
torch code and say why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

INCLUDE = Path(__file__).with_name("csrc")  # headers the kernels share (fast_exp.h)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", f"-I{INCLUDE}"]


def cache_dir() -> Path:
    root = os.environ.get("MINILLM_CACHE") or Path.home() / ".cache" / "minillm"
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    """What -march=native compiled for: the CPU's feature flags (a shared home on another CPU rebuilds)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load(source: Path) -> ctypes.CDLL | str:
    """The compiled `source`, loaded — or why it cannot be."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler found (set CC, or install gcc)"
    code = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(INCLUDE.glob("*.h")))  # a header edit rebuilds
    key = hashlib.sha256(code + " ".join([compiler, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # built aside, then moved: never half a file
                built = Path(tmp) / target.name
                try:
                    run = subprocess.run([compiler, *FLAGS, str(source), "-o", str(built), "-lm"],
                                         capture_output=True, text=True, timeout=120)
                except (OSError, subprocess.TimeoutExpired) as err:
                    return f"the C compiler {compiler!r} could not run: {err}"
                if run.returncode:
                    return f"building {source.name} failed: {run.stderr.strip()[-500:]}"
                os.replace(built, target)
        except OSError as err:  # a cache folder that cannot be written (a read-only home)
            return f"the kernel cache {target.parent} is not writable ({err}); set MINILLM_CACHE to a folder that is"
    try:
        return ctypes.CDLL(str(target))
    except OSError as err:
        return f"loading {target} failed: {err}"
