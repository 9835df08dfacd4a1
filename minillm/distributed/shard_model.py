"""Build one rank's shard of a model: the same CausalLM classes, holding only this rank's slices.

The weights come from a mapping name -> tensor-like (the whole model in memory on rank 0, or a
safetensors file opened lazily by a worker, which then reads only its own slices — what real
engines do with checkpoints too large for one device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minillm.distributed.communicator import Communicator
from minillm.distributed.sharding import TensorShard
from minillm.model.config import ModelConfig
from minillm.model.decoder import CausalLM


def build_shard(config: ModelConfig, communicator: Communicator, weight: Callable[[str], Any], dtype: torch.dtype,
                device: torch.device) -> CausalLM:
    """Rank `communicator.rank`'s shard of the model `config` describes; `weight(name)` gives the whole
    parameter `name` (or a lazy slice of it)."""
    shard = TensorShard(communicator.rank, communicator.size)
    with torch.device("meta"):
        net = CausalLM(config, communicator)
    net = net.to_empty(device=device).to(dtype)
    net.rope.compute_tables()  # buffers made on the meta device hold no values yet
    with torch.no_grad():
        for name, param in net.state_dict().items():
            piece = shard.shard(name, weight(name), config)
            if piece.shape != param.shape:
                raise ValueError(f"rank {shard.rank}: {name} has shape {tuple(piece.shape)} in the checkpoint's "
                                 f"slice, the shard expects {tuple(param.shape)}")
            param.copy_(piece)
    return net.eval()
