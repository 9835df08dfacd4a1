"""KV-cache bookkeeping in plain integers: which blocks each request holds (no torch here)."""

from minillm.kv.block_pool import BlockPool, OutOfBlocks

__all__ = ["BlockPool", "OutOfBlocks"]
