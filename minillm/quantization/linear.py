"""Linear layers whose weights are int8 or int4 codes, multiplied without ever holding the float weight.

On the CPU they run PyTorch's weight-only kernels, which dequantize a block of codes in registers and
multiply it at once: `aten._weight_int8pack_mm` (int8 codes, a scale per output channel) and
`aten._weight_int4pack_mm_for_cpu` (int4 codes in the kernel's own blocked layout, made once by
`aten._convert_weight_to_int4pack_for_cpu`, a scale and zero per group). Those kernels are vectorized for
bfloat16 activations only: with float32 ones PyTorch 2.13 takes a scalar path (measured on the course's CPU,
16 rows x 256 -> 1536: 5.3 ms for int8, 10.7 ms for int4, against 0.2 ms with bfloat16 activations and
0.14 ms for the float32 matmul). So a float32 model's quantized layers round their input to bfloat16 for
the matmul and return float32 — an error of the order of bfloat16's (0.4% per number), below int8's own,
and part of every quality figure the course measures. Under torch.compile the CPU kernels run as opaque
custom ops (Inductor's own lowering of them refuses scales converted inside the graph), so a compiled step
computes exactly the eager step's numbers. On CUDA a Triton kernel does the same
(minillm/quantization/triton_matmul.py). Anywhere else (float16 on the CPU) the reference runs: the weight
dequantized, then F.linear — the same numbers up to rounding, without the saving.

A layer is built for the device its codes are on: on the CPU an int4 layer keeps only the kernel's
layout (its `dequantize()` reads the weight back through the kernel itself) — unless its outputs are not a
multiple of 16, which that layout cannot hold: such a layer keeps the portable codes and runs the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm.quantization import triton_matmul
from minillm.quantization.formats import Int4Weight, Int8Weight

KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what the CPU kernels take as activations
INT4_ZERO_CODE = 8  # the CPU int4 kernel computes w = (q - 8) · scale + zero
INT4_CPU_ROWS = 16  # the CPU int4 kernel's layout holds a multiple of 16 output channels


@torch.library.custom_op("minillm::int8_weight_mm_cpu", mutates_args=())
def _int8_mm_cpu(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`aten._weight_int8pack_mm` with the scales in x's dtype, as one op torch.compile does not look into."""
    return torch.ops.aten._weight_int8pack_mm(x, qweight, scale.to(x.dtype))


@_int8_mm_cpu.register_fake
def _(x, qweight, scale):
    return x.new_empty(x.shape[0], qweight.shape[0])


@torch.library.custom_op("minillm::int4_weight_mm_cpu", mutates_args=())
def _int4_mm_cpu(x: torch.Tensor, packed: torch.Tensor, group_size: int, scales_and_zeros: torch.Tensor
                 ) -> torch.Tensor:
    """`aten._weight_int4pack_mm_for_cpu` with the scales and zeros in x's dtype, as one opaque op."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros.to(x.dtype))


@_int4_mm_cpu.register_fake
def _(x, packed, group_size, scales_and_zeros):
    return x.new_empty(x.shape[0], scales_and_zeros.shape[1])


class QuantizedLinear(nn.Module):
    """What the int8 and int4 layers share: the shapes, the bias, the forward's reshaping."""

    scheme = ""

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features)."""
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] == 0:
            out = flat.new_zeros(0, self.out_features)
        elif self._kernel_runs(flat):  # bfloat16 activations: the kernels' fast path (see above)
            out = self._kernel(flat.to(torch.bfloat16).contiguous()).to(flat.dtype)
        elif flat.is_cuda and triton_matmul.unavailable_reason(flat.device) is None and \
                not torch.compiler.is_compiling():
            out = self._triton(flat)
        else:
            out = F.linear(flat, self.dequantize().to(flat.dtype))
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def _kernel_runs(self, x: torch.Tensor) -> bool:
        return x.is_cpu and x.dtype in KERNEL_DTYPES

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _triton(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """(out_features, in_features) float32: the weight the codes stand for."""
        raise NotImplementedError

    @property
    def weight_bytes(self) -> int:
        """Bytes of codes and scales (and zeros) a forward pass reads."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Linear(QuantizedLinear):
    """Weight-only int8: a code per weight, a float32 scale per output channel."""

    scheme = "int8"

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None = None):
        super().__init__(weight.q.shape[1], weight.q.shape[0], bias)
        self.register_buffer("qweight", weight.q.contiguous())  # (N, K) int8
        self.register_buffer("scale", weight.scale.float().contiguous())  # (N,)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        """x: (M, K) float32 or bfloat16 (the scales follow it) -> (M, N) in x's dtype."""
        if torch.compiler.is_compiling():
            return _int8_mm_cpu(x, self.qweight, self.scale)
        return torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scale.to(x.dtype))

    def _triton(self, x: torch.Tensor) -> torch.Tensor:
        return triton_matmul.int8_matmul(x, self.qweight, self.scale)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale[:, None]


class Int4Linear(QuantizedLinear):
    """Weight-only int4 in groups: two codes per byte, a scale and a minimum per group."""

    scheme = "int4"

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None):
        n, k = weight.packed.shape[0], weight.packed.shape[1] * 2
        super().__init__(k, n, bias)
        self.group_size = weight.group_size
        if weight.packed.is_cpu and n % INT4_CPU_ROWS == 0:
            # the kernel's blocked layout only; its scale and zero per (group, channel)
            codes = weight.q.to(torch.int32)
            self.register_buffer("cpu_packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
            zero = weight.minimum + INT4_ZERO_CODE * weight.scale
            self.register_buffer("scales_and_zeros",
                                 torch.stack([weight.scale, zero], dim=-1).transpose(0, 1).contiguous().float())
        else:
            self.register_buffer("packed", weight.packed.contiguous())  # (N, K // 2) uint8
            self.register_buffer("scale", weight.scale.float().contiguous())  # (N, K // G)
            self.register_buffer("minimum", weight.minimum.float().contiguous())  # (N, K // G)

    def _kernel_runs(self, x: torch.Tensor) -> bool:
        return hasattr(self, "cpu_packed") and super()._kernel_runs(x)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        """x: (M, K) float32 or bfloat16 (the scales and zeros follow it) -> (M, N) in x's dtype."""
        if torch.compiler.is_compiling():
            return _int4_mm_cpu(x, self.cpu_packed, self.group_size, self.scales_and_zeros)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.cpu_packed, self.group_size,
                                                            self.scales_and_zeros.to(x.dtype))

    def _triton(self, x: torch.Tensor) -> torch.Tensor:
        return triton_matmul.int4_matmul(x, self.packed, self.scale, self.minimum, self.group_size)

    def dequantize(self) -> torch.Tensor:
        if hasattr(self, "cpu_packed"):  # read back through the kernel, in float32: the identity times W^T is W^T
            eye = torch.eye(self.in_features, dtype=torch.float32, device=self.cpu_packed.device)
            return self._kernel(eye).T.contiguous()
        return Int4Weight(self.packed, self.scale, self.minimum, self.group_size).dequantize()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}"
