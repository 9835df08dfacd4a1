"""The paged KV cache: K/V storage cut into fixed-size blocks, and the backend that attends through
block tables.

    k[layer]: (num_blocks, block_size, num_kv_heads, head_dim)

Which blocks belong to whom is the block pool's business (`minillm/kv/block_pool.py`); here a
sequence arrives with its block table, and token t of it lives at slot
`table[t // block_size] * block_size + t % block_size`. The operations come from
`minillm/attention/paged_ops.py` (torch, runs everywhere), on CUDA with Triton installed
`minillm/attention/triton_paged.py`, or on a CPU in float32 `minillm/attention/cpu_paged.py` (a C
decode kernel; same signatures). `kv_cache_dtype` "int8" or "fp8" stores codes instead of floats
(chapter 12: minillm/attention/kv_codes.py), through the torch operations or the Triton kernels.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from minillm.attention import kv_codes, paged_ops
from minillm.attention.backend import token_positions
from minillm.attention.block_table_rows import BlockTableRows
from minillm.memory import format_bytes, zeros_on_huge_pages


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                       kv_cache_dtype: str = "auto") -> int:
    """K and V of one token in every layer: 2 x layers x kv_heads x (head_dim x bytes, or a quantized
    cache's codes and scale: minillm/attention/kv_codes.py)."""
    return 2 * num_layers * num_kv_heads * kv_codes.bytes_per_head(kv_cache_dtype, dtype, head_dim)


class PagedKVCache:
    """The storage: a pile of `num_blocks` blocks per layer, for K and for V."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", use_triton: bool = False,
                 pad_block: bool = False, use_cpu_kernel: bool = False, kv_cache_dtype: str = "auto"):
        # pad_block: one more block, owned by no request, where the padding rows of a recorded step
        # (chapter 8) write and read; `num_blocks` stays the count requests can use
        kv_codes.check_kv_cache_dtype(kv_cache_dtype)
        shape = (num_blocks + pad_block, block_size, num_kv_heads, head_dim)
        stored = kv_codes.storage_dtype(kv_cache_dtype, dtype)
        self.k = [zeros_on_huge_pages(shape, stored, device) for _ in range(num_layers)]
        self.v = [zeros_on_huge_pages(shape, stored, device) for _ in range(num_layers)]
        # int8 codes: a float16 scale per token and KV head (chapter 12); none otherwise
        scaled = kv_cache_dtype == "int8"
        self.k_scale = [torch.zeros(shape[:3], dtype=kv_codes.SCALE_DTYPE, device=device) for _ in
                        range(num_layers)] if scaled else None
        self.v_scale = [torch.zeros(shape[:3], dtype=kv_codes.SCALE_DTYPE, device=device) for _ in
                        range(num_layers)] if scaled else None
        self.kv_cache_dtype = kv_cache_dtype
        self.num_blocks, self.block_size = num_blocks, block_size
        self.pad_block: int | None = num_blocks if pad_block else None
        self.table_rows = BlockTableRows(num_blocks, device)  # the sequences' tables, kept between passes
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype, kv_cache_dtype)
        if use_triton and use_cpu_kernel:
            raise ValueError("use_triton (CUDA) and use_cpu_kernel (CPU) exclude each other")
        if kv_cache_dtype != "auto" and use_cpu_kernel:
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} runs on the torch reference or the Triton kernels: "
                             "the C decode kernel reads the model's dtype (set use_cpu_kernel=False)")
        if use_cpu_kernel:
            from minillm.attention import cpu_paged

            reason = cpu_paged.unavailable_reason(torch.device(device), dtype)
            if reason is not None:
                raise ValueError(f"use_cpu_kernel=True, but the C kernel cannot run here: {reason}")
            self.ops = cpu_paged
        elif use_triton:
            from minillm.attention import triton_paged

            reason = triton_paged.unavailable_reason(torch.device(device))
            if reason is not None:
                raise ValueError(f"use_triton=True, but the Triton kernels cannot run here: {reason}")
            if block_size & (block_size - 1):
                raise ValueError(f"the Triton kernels need a power-of-two block_size, got {block_size}")
            self.ops = triton_paged
        else:
            self.ops = paged_ops

    @classmethod
    def for_model(cls, config, num_blocks: int, block_size: int, dtype: torch.dtype, device,
                  use_triton: bool = False, pad_block: bool = False, use_cpu_kernel: bool = False,
                  kv_cache_dtype: str = "auto") -> PagedKVCache:
        return cls(config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype, device,
                   use_triton, pad_block, use_cpu_kernel, kv_cache_dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v + (self.k_scale or []) + (self.v_scale or []))

    def read_blocks(self, blocks: Sequence[int]) -> torch.Tensor:
        """A copy of the K/V in `blocks`, every layer: (2, num_layers, len(blocks), block_size, num_kv_heads,
        head_dim) — what a prefill worker sends to a decode worker (chapter 13)."""
        if self.k_scale is not None or self.kv_cache_dtype != "auto":
            raise ValueError(f"moving K/V between engines reads the model's dtype, not {self.kv_cache_dtype} codes")
        index = torch.tensor(list(blocks), device=self.k[0].device)
        return torch.stack([torch.stack([layer.index_select(0, index) for layer in side]) for side in (self.k, self.v)])

    def write_blocks(self, blocks: Sequence[int], kv: torch.Tensor) -> None:
        """Store `read_blocks`' tensor (or the rows of it given) into `blocks` of this cache."""
        if self.kv_cache_dtype != "auto":
            raise ValueError(f"moving K/V between engines writes the model's dtype, not {self.kv_cache_dtype} codes")
        index = torch.tensor(list(blocks), device=self.k[0].device)
        for side, layers in enumerate((self.k, self.v)):
            for layer, storage in enumerate(layers):
                storage.index_copy_(0, index, kv[side, layer].to(storage.device, storage.dtype))

    def scales(self, layer: int) -> dict[str, torch.Tensor]:
        """The keyword arguments the ops take for `layer`'s scales (none for an unscaled cache)."""
        if self.k_scale is None:
            return {}
        return {"k_scale": self.k_scale[layer], "v_scale": self.v_scale[layer]}

    @property
    def num_slots(self) -> int:
        """Tokens the cache can hold."""
        return self.num_blocks * self.block_size

    def describe(self) -> str:
        pad = " (+1 pad block)" if self.pad_block is not None else ""
        codes = f", {self.kv_cache_dtype}" if self.kv_cache_dtype != "auto" else ""
        return (f"paged KV cache: {self.num_blocks} blocks{pad} x {self.block_size} tokens = {self.num_slots} tokens, "
                f"{format_bytes(self.bytes_per_token)} per token{codes}, {format_bytes(self.nbytes)}")

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """For each (source, destination): the source block's K/V into the destination block, in every
        layer (copy-on-write: one block per sample, whatever the prompt's length). One indexed copy
        per layer for all the pairs."""
        if not copies:
            return
        device = self.k[0].device
        sources = torch.tensor([s for s, _ in copies], dtype=torch.long, device=device)
        destinations = torch.tensor([d for _, d in copies], dtype=torch.long, device=device)
        for tensor in self.k + self.v + (self.k_scale or []) + (self.v_scale or []):
            tensor.index_copy_(0, destinations, tensor.index_select(0, sources))

    def batch(self, block_tables: Sequence[Sequence[int]], starts: list[int], query_lens: list[int],
              rows: Sequence[int] | None = None) -> PagedBatch:
        """The backend for one forward pass: sequence i writes query_lens[i] tokens at positions
        starts[i]... through its block table, attending to everything before them. `rows`: where
        each sequence's table is kept between passes (its batch slot; default 0, 1, ...), so that
        only what changed since the last pass is written (`minillm/attention/block_table_rows.py`)."""
        rows = range(len(block_tables)) if rows is None else rows
        if len(set(rows)) != len(rows) or len(rows) != len(block_tables):
            raise ValueError(f"one distinct row per sequence, got rows {list(rows)} for {len(block_tables)} sequences")
        for table, start, n in zip(block_tables, starts, query_lens):
            if start + n > len(table) * self.block_size:
                raise ValueError(f"a sequence of {start + n} tokens does not fit its {len(table)} blocks")
        return PagedBatch(self, block_tables, starts, query_lens, rows)


class PagedBatch:
    """The backend of one forward pass on the paged cache.

    Every new token's K/V is written to its slot in one call (`store_kv`). Decode rows (one new
    token: a decode, or a prefill chunk of one token) then attend in one `paged_decode_attention`
    call through their block tables (the torch reference: one call per group of similar context
    lengths, grouped here once per pass), and the rows of sequences bringing several tokens (a prefill,
    or a chunk extending one) in one `paged_prefill_attention` call. Index tensors are built once
    and reused by every layer.
    """

    def __init__(self, cache: PagedKVCache, block_tables: Sequence[Sequence[int]], starts: list[int],
                 query_lens: list[int], rows: Sequence[int]):
        self.cache = cache
        device, size = cache.k[0].device, cache.block_size
        cache.table_rows.sync(rows, block_tables)  # only what changed since the last pass is written
        # every new token's slot, read from its sequence's table: Python over the new tokens (not the blocks)
        slots = [table[p // size] * size + p % size
                 for table, start, n in zip(block_tables, starts, query_lens) for p in range(start, start + n)]
        self.slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)  # (num_tokens,)
        self.positions = token_positions(starts, query_lens, device)  # (num_tokens,)
        offsets = [0, *itertools.accumulate(query_lens)][:-1]
        decode = [i for i, n in enumerate(query_lens) if n == 1]
        groups = [decode]
        if cache.ops is paged_ops:  # the torch reference pads each call's rows to its longest context
            groups = [[decode[j] for j in group] for group in similar_lengths([starts[i] + 1 for i in decode])]

        def tables(group: list[int]) -> torch.Tensor:  # (len(group), width): the group's rows of the kept tables
            width = max(len(block_tables[i]) for i in group)
            return cache.table_rows.gather(torch.tensor([rows[i] for i in group], device=device), width)

        # per group of decode rows: (rows of q — a slice where they are adjacent, (rows, width) block tables,
        # context lengths)
        self.decode_groups = [(_rows(group, offsets, device), tables(group),
                               torch.tensor([starts[i] + 1 for i in group], dtype=torch.int32, device=device))
                              for group in groups if group]
        self.all_decode = (len(decode) == len(query_lens) and len(self.decode_groups) == 1  # every row, in order
                           and isinstance(self.decode_groups[0][0], slice))
        # prefill / extend rows: every sequence bringing several tokens, in one call per layer (none: no tensors)
        prefill = [i for i, n in enumerate(query_lens) if n > 1]
        self.max_prefill_len = max((query_lens[i] for i in prefill), default=0)
        if prefill:
            self.prefill_tables = tables(prefill)
            self.prefill_rows = torch.tensor([offsets[i] for i in prefill], dtype=torch.int32, device=device)
            self.prefill_lens = torch.tensor([query_lens[i] for i in prefill], dtype=torch.int32, device=device)
            self.prefill_starts = torch.tensor([starts[i] for i in prefill], dtype=torch.int32, device=device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q: (num_tokens, heads, head_dim); k, v: (num_tokens, kv_heads, head_dim) -> like q."""
        ops, k_cache, v_cache = self.cache.ops, self.cache.k[layer], self.cache.v[layer]
        scales = self.cache.scales(layer)  # a quantized cache's (chapter 12): {} otherwise
        ops.store_kv(k, v, k_cache, v_cache, self.slot_mapping, **scales)
        if self.all_decode:  # a pure decode step: the kernel's output is the layer's
            _, tables, context_lens = self.decode_groups[0]
            return ops.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, scale, **scales)
        out = torch.empty_like(q)
        for rows, tables, context_lens in self.decode_groups:
            out[rows] = ops.paged_decode_attention(q[rows], k_cache, v_cache, tables, context_lens, scale, **scales)
        if self.max_prefill_len:
            ops.paged_prefill_attention(q, k_cache, v_cache, self.prefill_tables, self.prefill_rows, self.prefill_lens,
                                        self.prefill_starts, scale, out, self.max_prefill_len, **scales)
        return out


def _rows(group: list[int], offsets: list[int], device) -> slice | torch.Tensor:
    """Where a group's rows lie in q: a slice when they are adjacent (a view; no gather), else their indices."""
    rows = [offsets[i] for i in group]
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.tensor(rows, dtype=torch.long, device=device)


def similar_lengths(lengths: list[int], floor: int = 64) -> list[list[int]]:
    """Indices grouped so that no group's longest context is more than twice its shortest (contexts
    under `floor` count as `floor`): one decode with a long context then no longer pads every short
    one up to its length in the torch reference. Usually a single group."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] <= 2 * max(lengths[groups[-1][0]], floor):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
