"""A model's linear layers quantized, the rest shared: `quantize_model(model, "int8")`.

The decoder's four matmuls per layer — qkv_proj, o_proj, gate_up_proj, down_proj — hold nearly all of
its weights and are read in full by every decode step, so they are what weight-only quantization
shrinks. The embeddings (a row gathered per token, not a matmul) and the LM head stay in the model's
dtype: the course's model ties them into one matrix, and the logits are where an error shows first —
vLLM's int8/int4 schemes also leave the LM head alone by default.

The result is a new CausalLM: the quantized layers are new modules, every other module is a shallow
copy whose parameters (embeddings, norms, biases) are the original tensors — nothing is copied and
the original model is left as it was. Loading a checkpoint with `quantization=` quantizes as it loads
and drops the float layers.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from minillm.model.decoder import CausalLM
from minillm.quantization.formats import GROUP_SIZES, check_group_size, quantize_int4, quantize_int8
from minillm.quantization.linear import Int4Linear, Int8Linear, QuantizedLinear
from minillm.sampling import is_int

SCHEMES = ("int8", "int4")
QUANTIZED_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
DEFAULT_GROUP_SIZE = 64


def check_scheme(scheme: object, group_size: object = DEFAULT_GROUP_SIZE, allow_none: bool = False) -> None:
    """A ValueError naming the field, for a scheme or group size the engine does not know (a group size must be
    an integer, Python's or numpy's; `allow_none`: no scheme is one)."""
    if not (scheme is None and allow_none) and not (isinstance(scheme, str) and scheme in SCHEMES):
        raise ValueError(f"quantization must be one of {SCHEMES} (or None), got {scheme!r}")
    if not is_int(group_size) or group_size not in GROUP_SIZES:
        raise ValueError(f"quantization_group_size must be one of {GROUP_SIZES}, got {group_size!r}")


def quantize_model(model: CausalLM, scheme: str, group_size: int = DEFAULT_GROUP_SIZE) -> CausalLM:
    """`model` with its decoder layers' linear layers in `scheme` ("int8": per channel; "int4": groups of
    `group_size` inputs). Refuses a model that is quantized already, and a group size that does not divide
    a layer's inputs, or a layer with inf or NaN weights (ValueError)."""
    check_scheme(scheme, group_size)
    scheme, group_size = str(scheme), int(group_size)  # numpy's as Python's: what the int4 kernels take
    if quantization_of(model) is not None:
        raise ValueError(f"the model is quantized already ({quantization_of(model)})")
    for name, module in _targets(model):
        if scheme == "int4":
            check_group_size(group_size, module.in_features)
        if not torch.isfinite(module.weight).all():  # its codes would hide it: a NaN row's scale would be 1
            raise ValueError(f"{name}.weight holds inf or NaN: a checkpoint with non-finite weights cannot be "
                             "quantized")
    quantized = _shallow_copy(model, scheme, group_size)
    quantized.quantization = scheme if scheme == "int8" else f"int4 (group {group_size})"
    return quantized


def quantization_of(model: nn.Module) -> str | None:
    """"int8", "int4 (group 64)"... or None for a float model."""
    return getattr(model, "quantization", None)


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the decoder layers' matmul weights (codes and scales, or floats) and of everything else."""
    layers = other = 0
    quantized_params = set()
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            layers += module.weight_bytes
            quantized_params |= {id(p) for p in module.parameters()}
    for _, module in _targets(model, include_quantized=False):
        layers += module.weight.numel() * module.weight.element_size()
        quantized_params.add(id(module.weight))
    seen = set()
    for p in model.parameters():
        if id(p) not in quantized_params and id(p) not in seen:
            seen.add(id(p))
            other += p.numel() * p.element_size()
    return {"linear layers": layers, "other": other}


def _targets(model: nn.Module, include_quantized: bool = True):
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in QUANTIZED_LAYERS and (isinstance(module, nn.Linear)
                                                            or (include_quantized and isinstance(module,
                                                                                                 QuantizedLinear))):
            yield name, module


def _shallow_copy(module: nn.Module, scheme: str, group_size: int) -> nn.Module:
    new = copy.copy(module)
    for name, value in vars(module).items():  # its own parameter and buffer dicts, hooks, non-persistent set:
        if isinstance(value, dict | set):  # a hook added to the copy must not run on the original
            vars(new)[name] = copy.copy(value)
    new._modules = {}
    for name, child in module._modules.items():
        if child is not None and name in QUANTIZED_LAYERS and isinstance(child, nn.Linear):
            new._modules[name] = _quantized(child, scheme, group_size)
        else:
            new._modules[name] = None if child is None else _shallow_copy(child, scheme, group_size)
    return new


def _quantized(layer: nn.Linear, scheme: str, group_size: int) -> QuantizedLinear:
    if scheme == "int8":
        return Int8Linear(quantize_int8(layer.weight), layer.bias)
    return Int4Linear(quantize_int4(layer.weight, group_size), layer.bias)
