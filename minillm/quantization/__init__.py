"""Quantization (chapter 12): weights in int8 or int4 codes, read by kernels that never hold the float weight."""

from minillm.quantization.formats import Int4Weight, Int8Weight, quantize_int4, quantize_int8
from minillm.quantization.linear import Int4Linear, Int8Linear, QuantizedLinear
from minillm.quantization.model import SCHEMES, quantization_of, quantize_model, weight_bytes

__all__ = ["SCHEMES", "Int4Linear", "Int4Weight", "Int8Linear", "Int8Weight", "QuantizedLinear",
           "quantization_of", "quantize_int4", "quantize_int8", "quantize_model", "weight_bytes"]
