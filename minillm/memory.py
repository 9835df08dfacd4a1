"""How much memory a device has left, and byte counts written for people."""

from __future__ import annotations

import os

import torch


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
