"""minillm/memory.py: freed activations are kept for reuse, not faulted in again each step."""

import resource
import sys

import pytest
import torch

from minillm import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_activation_is_reused_without_page_faults():
    assert memory.keep_freed_memory() is True and memory.keep_freed_memory() is True  # idempotent
    size = 24 << 20  # over glibc's default mmap threshold: mapped and unmapped on every allocation without the call
    for _ in range(3):  # the first allocations fault their pages in (and the heap settles around them)
        torch.empty(size // 4).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        torch.empty(size // 4).fill_(1.0)  # allocated, written, freed: as a forward pass's activations
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # without it every allocation faults all its pages in again (10 x 6,144); the heap may settle once more
    assert faults < 3 * size // 4096, f"{faults} page faults in 10 reuses of a {size >> 20} MiB buffer"


def test_the_engine_asks_for_it_on_cpu(model, monkeypatch):
    from minillm.engine import LLMEngine
    from tests.hf_reference import ByteTokenizer

    calls = []
    monkeypatch.setattr("minillm.engine.keep_freed_memory", lambda: calls.append(1) or True)
    LLMEngine(model, ByteTokenizer())
    assert calls == [1]
