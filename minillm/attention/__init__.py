"""Attention backends: where K and V live and how new queries attend to them."""

from minillm.attention.backend import AttentionBackend
from minillm.attention.contiguous import ContiguousKVCache
from minillm.attention.dense import DenseAttention
from minillm.attention.paged import PagedKVCache

__all__ = ["AttentionBackend", "ContiguousKVCache", "DenseAttention", "PagedKVCache"]
