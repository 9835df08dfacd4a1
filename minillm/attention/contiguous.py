"""A contiguous KV cache: each sequence owns one slot of `max_len` positions, reserved up front.

    k[layer]: (num_slots, max_len, num_kv_heads, head_dim)

    slot s:  | cached (start tokens) | new (query_len) | ...unused until max_len... |
              0                  start          start+query_len               max_len

Simple and fast to index, but every slot reserves `max_len` tokens whether the sequence uses them
or not: the waste that chapter 4's paged cache removes.
"""

from __future__ import annotations

import itertools

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


class ContiguousBatch:
    """The backend of one forward pass. Decode rows (one new token each) attend in one batched
    call over their slots, masked to each one's length; prefill rows attend one sequence at a time.
    Index tensors are built once here and reused by every layer."""

    def __init__(self, cache: ContiguousKVCache, slots: list[int], starts: list[int], query_lens: list[int]):
        self.cache = cache
        device = cache.k[0].device
        offsets = [0, *itertools.accumulate(query_lens)][:-1]
        decode = [i for i, n in enumerate(query_lens) if n == 1]
        self.prefills = [(offsets[i], slots[i], starts[i], n) for i, n in enumerate(query_lens) if n > 1]
        self.decode_rows = torch.tensor([offsets[i] for i in decode], dtype=torch.long, device=device)
        self.decode_slots = torch.tensor([slots[i] for i in decode], dtype=torch.long, device=device)
        self.decode_pos = torch.tensor([starts[i] for i in decode], dtype=torch.long, device=device)
        self.decode_len = max((starts[i] + 1 for i in decode), default=0)
        # (num_decode, 1, 1, decode_len): key j is visible to row i when j <= its position
        visible = torch.arange(self.decode_len, device=device)[None, :] <= self.decode_pos[:, None]
        self.decode_mask = visible[:, None, None]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        out = torch.empty_like(q)  # (num_tokens, heads, head_dim)
        if len(self.decode_rows):
            k_cache[self.decode_slots, self.decode_pos] = k[self.decode_rows]
            v_cache[self.decode_slots, self.decode_pos] = v[self.decode_rows]
            keys = k_cache[self.decode_slots, : self.decode_len].transpose(1, 2)  # (B, kv_heads, len, head_dim)
            values = v_cache[self.decode_slots, : self.decode_len].transpose(1, 2)
            queries = q[self.decode_rows].unsqueeze(2)  # (B, heads, 1, head_dim)
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.decode_mask, scale=scale,
                                               enable_gqa=True)
            out[self.decode_rows] = o.squeeze(2)
        for offset, slot, start, n in self.prefills:
            end = start + n
            k_cache[slot, start:end] = k[offset : offset + n]
            v_cache[slot, start:end] = v[offset : offset + n]
            qs = q[offset : offset + n].transpose(0, 1)[None]  # (1, heads, n, head_dim)
            ks = k_cache[slot, :end].transpose(0, 1)[None]  # (1, kv_heads, end, head_dim)
            vs = v_cache[slot, :end].transpose(0, 1)[None]
            # query i (absolute position start+i) sees keys 0..start+i
            mask = torch.ones(n, end, dtype=torch.bool, device=q.device).tril(diagonal=start)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
            out[offset : offset + n] = o[0].transpose(0, 1)
        return out
