"""A contiguous KV cache: each sequence owns one slot of `max_len` positions, reserved up front.

    k[layer]: (num_slots, num_kv_heads, max_len, head_dim)

    slot s, one head:  | cached (start tokens) | new (query_len) | ...unused until max_len... |
                        0                  start          start+query_len               max_len

Simple and fast to index, but every slot reserves `max_len` tokens whether the sequence uses them
or not: the waste that chapter 4's paged cache removes.

Heads come before positions so that `k[layer][:, :, :n]` — every slot's first n positions — is a
*view*: decode attention reads the cache in place instead of copying each slot's keys out.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from minillm.attention.backend import token_positions
from minillm.attention.causal import causal_attention
from minillm.attention.masks import additive_mask
from minillm.memory import format_bytes


class ContiguousKVCache:
    """The storage: K and V tensors per layer, one row per slot."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots, self.max_len = num_slots, max_len

    @classmethod
    def for_model(cls, config, num_slots: int, max_len: int, dtype: torch.dtype, device) -> ContiguousKVCache:
        return cls(config.num_layers, num_slots, max_len, config.num_kv_heads, config.head_dim, dtype, device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def describe(self) -> str:
        per_token = self.nbytes // (self.num_slots * self.max_len)
        return (f"contiguous KV cache: {self.num_slots} slots x {self.max_len} tokens reserved, "
                f"{format_bytes(per_token)} per token, {format_bytes(self.nbytes)}")

    def copy_slots(self, copies: list[tuple[int, int, int]]) -> None:
        """For each (source, destination, n): the source slot's first n positions into the destination
        (a fork: each of n samples needs the prompt's K/V in its own slot — the whole prompt, copied)."""
        for source, destination, n in copies:
            for k, v in zip(self.k, self.v):
                k[destination, :, :n] = k[source, :, :n]
                v[destination, :, :n] = v[source, :, :n]

    def batch(self, slots: list[int], starts: list[int], query_lens: list[int]) -> ContiguousBatch:
        """The backend for one forward pass: sequence i writes query_lens[i] tokens into slot
        slots[i] at positions starts[i]..., attending to everything before them in its slot."""
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot may appear once per forward pass, got slots {slots}")
        for slot, start, n in zip(slots, starts, query_lens):
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"slot {slot} out of range [0, {self.num_slots})")
            if start + n > self.max_len:
                raise ValueError(f"slot {slot} would hold {start + n} tokens, more than max_len={self.max_len}")
        return ContiguousBatch(self, slots, starts, query_lens)


class ContiguousBatch:
    """The backend of one forward pass.

    Decode rows (one new token each) attend in ONE call. When they fill most of the slots they read
    the cache in place: every slot up to the highest decoding one takes part, and a slot that is
    not decoding gets a zero query whose output is dropped. When they are few (the tail of a run),
    their slots are gathered instead, so three stragglers do not pay for sixty-four slots. GQA
    needs no copies either: the `group` query heads sharing a KV head are laid out as that head's
    query rows, (slots, kv_heads, group, head_dim) against (slots, kv_heads, len, head_dim).
    Prefill rows attend one sequence at a time. Index tensors are built once here and reused by
    every layer."""

    def __init__(self, cache: ContiguousKVCache, slots: list[int], starts: list[int], query_lens: list[int]):
        self.cache = cache
        device = cache.k[0].device
        self.positions = token_positions(starts, query_lens, device)  # (num_tokens,)
        offsets = [0, *itertools.accumulate(query_lens)][:-1]
        decode = [i for i, n in enumerate(query_lens) if n == 1]
        self.prefills = [(offsets[i], slots[i], starts[i], n) for i, n in enumerate(query_lens) if n > 1]
        self.decode_rows = torch.tensor([offsets[i] for i in decode], dtype=torch.long, device=device)
        self.decode_slots = torch.tensor([slots[i] for i in decode], dtype=torch.long, device=device)
        self.decode_pos = torch.tensor([starts[i] for i in decode], dtype=torch.long, device=device)
        highest = max((slots[i] + 1 for i in decode), default=0)
        self.in_place = 2 * len(decode) >= highest  # else gather the decoding slots
        self.num_decode_slots = highest if self.in_place else len(decode)  # slots taking part
        self.decode_len = max((starts[i] + 1 for i in decode), default=0)  # keys 0..this-1 are read
        # (num_decode_slots, 1, 1, decode_len): slot s sees key j when j <= its position; idle slots see key 0
        if self.in_place:
            self.query_index = self.decode_slots  # decode row i -> row of the attention batch
            last = torch.zeros(highest, dtype=torch.long, device=device)
            last[self.decode_slots] = self.decode_pos
        else:
            self.query_index = torch.arange(len(decode), device=device)
            last = self.decode_pos
        visible = torch.arange(self.decode_len, device=device)[None, :] <= last[:, None]
        self.decode_mask = additive_mask(visible[:, None, None], cache.k[0].dtype)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q: (num_tokens, heads, head_dim); k, v: (num_tokens, kv_heads, head_dim) -> like q."""
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        out = torch.empty_like(q)
        if self.num_decode_slots:
            self._decode(q, k, v, k_cache, v_cache, scale, out)
        for offset, slot, start, n in self.prefills:
            end = start + n
            k_cache[slot, :, start:end] = k[offset : offset + n].transpose(0, 1)
            v_cache[slot, :, start:end] = v[offset : offset + n].transpose(0, 1)
            qs = q[offset : offset + n].transpose(0, 1)[None]  # (1, heads, n, head_dim)
            o = causal_attention(qs, k_cache[slot, None, :, :end], v_cache[slot, None, :, :end], start, scale)
            out[offset : offset + n] = o[0].transpose(0, 1)
        return out

    def _decode(self, q, k, v, k_cache, v_cache, scale, out) -> None:
        rows, slots, length = self.decode_rows, self.decode_slots, self.decode_len
        k_cache[slots, :, self.decode_pos] = k[rows]  # (num_decode, kv_heads, head_dim)
        v_cache[slots, :, self.decode_pos] = v[rows]
        num_slots, (_, heads, head_dim), kv_heads = self.num_decode_slots, q.shape, k.shape[1]
        if self.in_place:  # (num_slots, kv_heads, len, head_dim), views of the cache
            keys, values = k_cache[:num_slots, :, :length], v_cache[:num_slots, :, :length]
        else:  # copies of the decoding slots only
            keys = k_cache[:, :, :length].index_select(0, slots)
            values = v_cache[:, :, :length].index_select(0, slots)
        queries = q.new_zeros(num_slots, heads, head_dim)
        queries[self.query_index] = q[rows]
        queries = queries.view(num_slots, kv_heads, heads // kv_heads, head_dim)  # GQA group as query rows
        o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.decode_mask, scale=scale)
        out[rows] = o.reshape(num_slots, heads, head_dim)[self.query_index]
