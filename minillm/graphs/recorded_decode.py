"""Pure-decode steps through a recorded step per batch-size bucket (chapter 8).

    a step's chunks ── one token each, no more rows than the largest bucket? ── no ──► eager (the runner)
                         │ yes
                         ▼
    bucket_for(rows) ─► pad_decode_batch ─► inputs[bucket].fill (in place) ─► replay ─► logits[:rows]

How a bucket's step is recorded:

    "cuda_graphs"  a CUDA Graph per bucket, captured at start-up (largest first, all in one memory
                   pool) and replayed with one launch; attention through the cache's kernels (Triton)
    "compile"      torch.compile(fullgraph=True, dynamic=False) per bucket, compiled the first time the
                   bucket is needed (~10 s each on a laptop CPU); one dimension is left dynamic, the block
                   tables' width, so a growing context does not recompile
    "eager"        the same static step, not recorded: the baseline the others are measured against

If compiling fails (no C compiler, a graph break), the engine says why once and runs eagerly.

The compiled step holds the weights *frozen*, as constants (Inductor then lays them out for the
CPU's matmul kernels: most of the gain at batch 1 in bfloat16). If they change in place
(`load_state_dict`), the step is compiled afresh. Known limitation: torch keeps frozen weights
until the process ends — each compiled engine built in a process holds on to about twice its
model's size — so build one compiled engine per process, as a server does.
"""

from __future__ import annotations

import logging
import types
import weakref
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from minillm.attention.paged import PagedKVCache
from minillm.graphs.buckets import bucket_for
from minillm.graphs.decode_step import decode_step
from minillm.graphs.padding import DecodeRow, pad_decode_batch
from minillm.graphs.static_inputs import StaticDecodeInputs
from minillm.model.decoder import CausalLM
from minillm.scheduler.output import ScheduledChunk

logger = logging.getLogger("minillm")

RECORDING = ("cuda_graphs", "compile", "eager")


class RecordedDecode:
    """Static buffers and a recorded step per bucket; `run(chunks)` for a step of pure decodes."""

    def __init__(self, model: CausalLM, cache: PagedKVCache, buckets: Sequence[int], how: str,
                 max_blocks_per_seq: int):
        if how not in RECORDING:
            raise ValueError(f"how must be one of {RECORDING}, got {how!r}")
        if cache.pad_block is None:
            raise ValueError("a recorded step needs a cache with a pad block (PagedKVCache(..., pad_block=True))")
        if how == "cuda_graphs" and cache.k[0].device.type != "cuda":
            raise ValueError("CUDA Graphs need the model and cache on a CUDA device")
        self.model, self.cache, self.how = model, cache, how
        self.buckets = sorted(buckets)
        self.width = max_blocks_per_seq
        largest = StaticDecodeInputs(self.buckets[-1], self.width, cache.block_size, cache.pad_block,
                                     cache.k[0].device)
        self.inputs = {b: largest.first_rows(b) for b in self.buckets}  # one memory: bucket b its first b rows
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # bucket -> (graph, its logits)
        self.compiled_buckets: set[int] = set()  # compile: buckets whose step has been compiled
        self.disabled_reason: str | None = None  # compile failed: why every step now runs eagerly
        self._compiled = self._compile() if how == "compile" else None
        self._weights_seen = self._weights_version()
        self._pool = torch.cuda.graph_pool_handle() if how == "cuda_graphs" else None  # one pool for every graph

    def accepts(self, chunks: Sequence[ScheduledChunk]) -> bool:
        """A step it can run: only one-token chunks (decodes; no prefill, no guesses), within a bucket."""
        return (self.disabled_reason is None and 0 < len(chunks) <= self.buckets[-1]
                and all(c.num_tokens == 1 and not c.is_padding for c in chunks))

    def run(self, chunks: Sequence[ScheduledChunk]) -> tuple[torch.Tensor, int] | None:
        """(logits (len(chunks), vocab), the bucket it ran) — or None if compiling failed just now
        (the caller runs the step eagerly; K/V written so far are written again)."""
        bucket = bucket_for(len(chunks), self.buckets)
        rows = [DecodeRow(c.token_ids[0], c.start, c.block_table) for c in chunks]
        inputs = self.inputs[bucket]
        # only as many columns as the longest block table are written (at least 2: to torch.compile a
        # width of 1 would be a special case, and a second graph); the columns after them are never read
        used = max(2, max(len(row.block_table) for row in rows))
        inputs.fill(pad_decode_batch(rows, bucket, min(used, self.width), self.cache.block_size,
                                     self.cache.pad_block))
        if self.how == "cuda_graphs":
            if bucket not in self.graphs:
                self._capture(bucket)
            graph, logits = self.graphs[bucket]
            graph.replay()
            return logits[: len(rows)], bucket
        ids, positions, slots, tables, context_lens = inputs.tensors  # eager / compile: the used columns
        tables = tables[:, :used]
        if self._compiled is None:
            logits = decode_step(self.model, self.cache.k, self.cache.v, ids, positions, slots, tables,
                                 context_lens, self.cache.ops, self.cache.k_scale, self.cache.v_scale)
            return logits[: len(rows)], bucket
        if self._weights_version() != self._weights_seen:  # frozen weights changed in place: compile afresh
            self._release()
            self._compiled, self._weights_seen = self._compile(), self._weights_version()
            self.compiled_buckets.clear()
        torch._dynamo.mark_dynamic(tables, 1)  # the width may change; the batch may not
        # each bucket is one more graph of the same function: past torch's default limit (8) it would
        # quietly run eagerly, so the limit follows the buckets, and hitting it raises
        limits = {"recompile_limit": 8 + len(self.buckets), "fail_on_recompile_limit_hit": True}
        try:  # freezing: the weights become constants, so Inductor pre-packs them for the CPU's matmul kernels
            with torch._dynamo.config.patch(limits), torch._inductor.config.patch(freezing=True):
                logits = self._compiled(self.model, self.cache.k, self.cache.v, ids, positions, slots, tables,
                                        context_lens, self.cache.ops, self.cache.k_scale, self.cache.v_scale)
        except Exception as err:  # noqa: BLE001 (any failure to compile: say it once, run eagerly)
            self.disabled_reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.warning("compile=True: the decode step could not be compiled (%s); every step now runs eagerly",
                           self.disabled_reason)
            return None
        if bucket not in self.compiled_buckets:
            self.compiled_buckets.add(bucket)
            logger.info("compiled the decode step for batch size %d", bucket)
        return logits[: len(rows)], bucket

    def _compile(self):
        """`decode_step` for torch.compile, as a function with a code object of this engine's own: Dynamo
        keeps its graphs (and counts its recompile limit) per code object, so engines never share them."""
        code = decode_step.__code__.replace()  # a copy
        own = types.FunctionType(code, decode_step.__globals__, decode_step.__name__, decode_step.__defaults__)
        # Dynamo keeps a code object's graphs for the life of the process: drop them with this engine (they
        # hold the frozen weights) — or when the weights change and a new copy replaces this one
        self._release = weakref.finalize(self, torch._dynamo.reset_code, code)
        return torch.compile(own, fullgraph=True, dynamic=False)

    def _weights_version(self) -> tuple[int, ...]:
        """Changes when any weight is written in place (`load_state_dict`, an optimizer step): the
        compiled step holds them frozen, as constants. (Weights created under `torch.inference_mode`
        keep no version counter: for them only a weight replaced by another tensor is noticed.)"""
        return tuple(p.data_ptr() if p.is_inference() else p._version for p in self.model.parameters())

    def capture(self, progress: bool = True) -> None:
        """CUDA Graphs: capture every bucket now, the largest first (the smaller ones then fit in the
        memory its capture already reserved in the shared pool)."""
        for bucket in tqdm(sorted(self.buckets, reverse=True), desc="capturing CUDA graphs", unit="graph",
                           disable=not progress):
            if bucket not in self.graphs:
                self._capture(bucket)

    def _capture(self, bucket: int) -> None:
        """Warm up on a side stream (Triton compiles, cuBLAS chooses its kernels: nothing of that may
        happen during capture), then record one step of padding rows into the shared pool."""
        inputs, ops = self.inputs[bucket], self.cache.ops

        def step() -> torch.Tensor:
            return decode_step(self.model, self.cache.k, self.cache.v, *inputs.tensors, ops=ops,
                               k_scale=self.cache.k_scale, v_scale=self.cache.v_scale)

        with torch.inference_mode():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = step()  # (bucket, vocab): overwritten by every replay
        self.graphs[bucket] = (graph, logits)
