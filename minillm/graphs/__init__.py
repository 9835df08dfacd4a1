"""Decode steps with fixed shapes (chapter 8): recorded once per batch-size bucket and replayed —
as CUDA Graphs on a GPU, as a `torch.compile`d step on a CPU.

    buckets.py   which batch sizes get a recorded step, and which bucket a batch pads up to
"""

from minillm.graphs.buckets import batch_size_buckets, bucket_for

__all__ = ["batch_size_buckets", "bucket_for"]
