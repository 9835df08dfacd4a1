"""A contiguous KV cache: each sequence owns one slot of `max_len` positions, reserved up front.

    k[layer]: (num_slots, max_len, num_kv_heads, head_dim)

    slot s:  | cached (start tokens) | new (query_len) | ...unused until max_len... |
              0                  start          start+query_len               max_len

Simple and fast to index, but every slot reserves `max_len` tokens whether the sequence uses them
or not: the waste that chapter 4's paged cache removes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class ContiguousKVCache:
    """The storage: K and V tensors per layer, one row per slot."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (num_slots, max_len, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots, self.max_len = num_slots, max_len

    @classmethod
    def for_model(cls, config, num_slots: int, max_len: int, dtype: torch.dtype, device) -> ContiguousKVCache:
        return cls(config.num_layers, num_slots, max_len, config.num_kv_heads, config.head_dim, dtype, device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def batch(self, slots: list[int], starts: list[int], query_lens: list[int]) -> ContiguousBatch:
        """The backend for one forward pass: sequence i writes query_lens[i] tokens into slot
        slots[i] at positions starts[i]..., attending to everything before them in its slot."""
        for slot, start, n in zip(slots, starts, query_lens):
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"slot {slot} out of range [0, {self.num_slots})")
            if start + n > self.max_len:
                raise ValueError(f"slot {slot} would hold {start + n} tokens, more than max_len={self.max_len}")
        return ContiguousBatch(self, slots, starts, query_lens)


@dataclass
class ContiguousBatch:
    cache: ContiguousKVCache
    slots: list[int]
    starts: list[int]
    query_lens: list[int]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        outputs, offset = [], 0
        for slot, start, n in zip(self.slots, self.starts, self.query_lens):
            end = start + n
            k_cache[slot, start:end] = k[offset : offset + n]
            v_cache[slot, start:end] = v[offset : offset + n]
            qs = q[offset : offset + n].transpose(0, 1)[None]  # (1, heads, n, head_dim)
            ks = k_cache[slot, :end].transpose(0, 1)[None]  # (1, kv_heads, end, head_dim)
            vs = v_cache[slot, :end].transpose(0, 1)[None]
            # query i (absolute position start+i) sees keys 0..start+i
            mask = None
            if n > 1:
                mask = torch.ones(n, end, dtype=torch.bool, device=q.device).tril(diagonal=start)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
            outputs.append(o[0].transpose(0, 1))  # (n, heads, head_dim)
            offset += n
        return torch.cat(outputs)
