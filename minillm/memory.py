"""How much memory a device has left, and byte counts written for people."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

import torch

HUGE_PAGE = 2 << 20  # bytes: a transparent huge page on x86-64 Linux
_MADV_HUGEPAGE = 14
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_FREED_BYTES = 512 << 20


def available_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation can take on `device`: free memory on a GPU; on a CPU the operating
    system's estimate of available memory (Linux's MemAvailable). None when it cannot be known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not every platform knows these names
        return None


def format_bytes(num_bytes: float) -> str:
    """256 -> '256 B', 1536 -> '1.5 KiB', 3 * 2**30 -> '3.0 GiB'."""
    if num_bytes < 1024:
        return f"{num_bytes:.0f} B"
    value, unit = num_bytes / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.zeros, but on a CPU under Linux the memory is asked for in 2 MiB pages (madvise
    MADV_HUGEPAGE) before anything touches it. A paged KV cache is read block by block at scattered
    places: with 4 KiB pages nearly every block costs a TLB miss and a page walk, which measured
    ~1.8x slower decode attention on the shipped model. Where huge pages are not granted, the
    memory is ordinary."""
    device = torch.device(device)
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return torch.zeros(shape, dtype=dtype, device=device)
    tensor = torch.empty(shape, dtype=dtype)
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE  # the whole huge pages inside
    if last > first:
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_HUGEPAGE)  # advice: may be refused
    return tensor.zero_()  # the first touch: pages are faulted in now, huge where granted


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@functools.cache
def keep_freed_memory(most: int = KEEP_FREED_BYTES) -> bool:
    """Ask glibc's malloc to keep freed blocks of up to `most` bytes for reuse; True where it agreed.

    By default glibc serves every allocation over 128 KiB-32 MiB with a fresh mmap and hands it back
    to the system on free, and returns free memory at the top of its heap too. A CPU forward pass
    allocates and frees the same activations every step, so every step faulted their pages in again:
    ~170,000 page faults in 6 s of the offline benchmark, 8-14% of its time. Raising both thresholds
    keeps that memory mapped (vLLM's CPU guide recommends preloading tcmalloc, which keeps it too). The
    cost: up to `most` freed bytes stay with the process. Process-wide, asked once; elsewhere than glibc,
    False.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = _libc()
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, most)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, most))
    except (OSError, AttributeError):  # no libc to load, or one without mallopt (musl has a stub)
        return False
