"""The oracle for a quantized KV cache: chapter 1's naive loop with every K and V read back through the
cache's codes (minillm/attention/kv_codes.py). Each token's codes depend on that token alone, so this loop,
which stores nothing, sees exactly the numbers the engine's paged cache holds, however the engine batched,
chunked, shared or recomputed them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minillm.attention.dense import DenseAttention
from minillm.attention.kv_codes import round_trip


class RoundTripAttention(DenseAttention):
    """The naive loop's attention with every K and V read back through the cache's codes."""

    def __init__(self, query_lens: list[int], kv_cache_dtype: str):
        super().__init__(query_lens)
        self.kv_cache_dtype = kv_cache_dtype

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return super().attend(layer, q, round_trip(k, self.kv_cache_dtype), round_trip(v, self.kv_cache_dtype),
                              scale)


@torch.inference_mode()
def naive_greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, kv_cache_dtype: str = "auto") -> list[int]:
    """Chapter 1's naive loop, greedy, every step recomputing the whole sequence — with its K/V rounded through
    `kv_cache_dtype`'s codes: the oracle the engine's quantized cache must equal token for token."""
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(max_new_tokens):
        seq = torch.tensor(ids + out, device=model.device)
        hidden = model(seq, torch.arange(len(seq), device=model.device), RoundTripAttention([len(seq)], kv_cache_dtype))
        out.append(int(model.logits(hidden[-1:])[0].argmax()))
    return out
