"""How a KV cache is built, as plain data: the engine decides it once; under tensor parallelism
every rank builds its own shard of the same cache (the same blocks, its own KV heads) from it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.contiguous import ContiguousKVCache
from minillm.attention.paged import PagedKVCache
from minillm.model.config import ModelConfig


@dataclass(frozen=True)
class CacheSpec:
    kind: str  # "contiguous" | "paged"
    num_slots: int = 0  # contiguous: one slot per batch slot...
    max_len: int = 0  # ...of max_len tokens
    num_blocks: int = 0  # paged
    block_size: int = 16
    use_triton: bool = False
    use_cpu_kernel: bool = False
    kv_cache_dtype: str = "auto"
    pad_block: bool = False  # a block for a recorded step's padding rows (chapter 8)

    def build(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> ContiguousKVCache | PagedKVCache:
        """The cache for a model whose layers have `config`'s shapes (a rank's `shard_config`)."""
        if self.kind == "contiguous":
            return ContiguousKVCache.for_model(config, self.num_slots, self.max_len, dtype, device)
        return PagedKVCache.for_model(config, self.num_blocks, self.block_size, dtype, device, self.use_triton,
                                      pad_block=self.pad_block, use_cpu_kernel=self.use_cpu_kernel,
                                      kv_cache_dtype=self.kv_cache_dtype)
