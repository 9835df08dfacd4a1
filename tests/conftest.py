"""Shared fixtures: a tiny model, and the checks that hold after every test that builds an engine
(DESIGN.md, invariant 3)."""

import os

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter. Triton reads this variable when it is
# first imported, so it is set here, before any test module can import it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minillm.engine import LLMEngine
from minillm.model import load_model
from tests.hf_reference import make_checkpoint


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A tiny random Qwen3 (GQA, q/k norm) for the engine tests."""
    folder = tmp_path_factory.mktemp("qwen3")
    make_checkpoint("qwen3", folder, seed=3)
    return load_model(folder, device="cpu")


@pytest.fixture(autouse=True)
def engines_end_clean(monkeypatch):
    """After the test, every engine it built is idle: no request left, every batch slot free, and
    (paged cache) no block held: each is free, or cached and evictable, with a zero reference count."""
    built: list[LLMEngine] = []
    init = LLMEngine.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(LLMEngine, "__init__", recording_init)
    yield built
    for engine in built:
        assert not engine.has_unfinished(), "an engine test left requests unfinished"
        assert sorted(engine.scheduler.free_slots) == list(range(engine.config.max_num_seqs)), "a slot leaked"
        if engine.pool is not None:
            assert engine.pool.is_idle, (f"KV blocks leaked: {engine.pool.num_free_blocks} of "
                                         f"{engine.pool.num_blocks} free, tables {engine.pool.tables}")
