"""Linear layers, whose CPU matmul runs through oneDNN with the weight packed once.

On CPU, `F.linear` calls a BLAS (MKL in PyTorch's wheels) that lays the weight out again on every call
and may leave a non-Intel CPU's widest vector units unused. oneDNN, given the weight packed ahead of
time into its own blocked layout (what vLLM's CPU backend and Inductor's freezing do), measured 2.5-3.5x
faster for 8 to 32 rows on the course's 2-core AVX-512 machine (M=32, 256 -> 1536: 186 -> 70 µs), and
each row's result does not depend on how many rows share the call (F.linear's does: its kernels
change with the batch). It differs from F.linear by float rounding only (about 1e-5 relative).

The packed copy is made on the first call and again whenever the weight changes (another tensor, or
written in place); it is kept beside the module, not in its state_dict. Anything else — CUDA, a dtype
oneDNN does not take here, autograd, torch.compile (Inductor packs for itself) — runs `F.linear`.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

PACK_ROWS = 32  # the row count oneDNN lays the weight out for (any count runs; decode batches are near it)
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_packed: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.Tensor]] = weakref.WeakKeyDictionary()


class Linear(nn.Linear):
    """nn.Linear whose CPU forward is `linear` (below)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, owner: nn.Module) -> torch.Tensor:
    """x @ weight.T + bias; on CPU through oneDNN with `weight` packed once, the packed copy kept for `owner`."""
    if not _packable(x, weight, bias):
        return F.linear(x, weight, bias)
    key = (weight.data_ptr(), -1 if weight.is_inference() else weight._version, weight.shape, weight.dtype)
    entry = _packed.get(owner)
    if entry is None or entry[0] != key:
        entry = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS))
        _packed[owner] = entry
    return torch.ops.mkldnn._linear_pointwise(x, entry[1], bias, "none", [], "")


def _packable(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (_ONEDNN and x.is_cpu and weight.is_cpu and x.dtype is weight.dtype
            and weight.dtype in _DTYPES and x.shape[-1] == weight.shape[1] and x.numel() > 0
            and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad
                                                   or (bias is not None and bias.requires_grad)))
            and not torch.compiler.is_compiling())


_DTYPES = (torch.float32, torch.bfloat16) if _ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported() \
    else (torch.float32,)
