"""Chapter 12 exercise `ch12.fastest_scheme`: which weight format gives the fastest decode step, from the
roofline of bytes moved and arithmetic done."""


def fastest_scheme(schemes: dict[str, dict], num_weights: int, kv_bytes_per_token: float,
                   context_lengths: list[int], bandwidth_gb_s: float, tflops: float) -> str:
    """The name of the scheme whose decode step the roofline model below predicts to be the fastest.

    schemes: name -> {"bits": b, "group_size": G, "group_bytes": s, "dequant_flops": d}:
        b      bits per stored weight (16 for bf16, 8 for int8, 4 for int4);
        G, s   the weights come in groups of G sharing s bytes of scale (and minimum); G is None for a
               scheme without groups (bf16, or int8 per channel, whose one scale per row we neglect);
        d      the arithmetic operations (FLOPs) it takes to turn one stored weight back into a number to
               multiply (0 for bf16). The kernel we model unpacks each weight again for every token.
    A decode step computes one new token for each of the B = len(context_lengths) running requests;
    request i has context_lengths[i] tokens in the KV cache, kv_bytes_per_token bytes each (K and V, all
    layers). The device reads bandwidth_gb_s * 1e9 bytes and computes tflops * 1e12 FLOPs per second.
    For every scheme:
        bytes   = num_weights * b / 8 + (num_weights / G) * s        (without the second term when G is None)
                  + sum(context_lengths) * kv_bytes_per_token        every weight and every cached token, once
        flops   = B * num_weights * (2 + d)                          a multiply-add per weight and token, plus
                                                                     the unpacking, per weight and token
        step_ms = 1000 * max(bytes / (bandwidth_gb_s * 1e9), flops / (tflops * 1e12))
    The max is the roofline: reading and computing overlap, so a step takes as long as the slower of the
    two. (Attention's own arithmetic and the activations' bytes are small here and left out.)
    Return the name with the least step_ms; among equal times (within 1e-9 ms), the first in the dict's order.
    Example: an 8e9-weight model on a GPU reading 3350 GB/s and computing 990 TFLOP/s, 131072 KV bytes per
    token, schemes {"bf16": {"bits": 16, "group_size": None, "group_bytes": 0, "dequant_flops": 0},
    "int8": {"bits": 8, "group_size": None, "group_bytes": 0, "dequant_flops": 1},
    "int4 g128": {"bits": 4, "group_size": 128, "group_bytes": 4, "dequant_flops": 2}}:
      one request at context 2000: 4.854, 2.466 and 1.347 ms, all bound by bandwidth -> "int4 g128";
      512 requests at context 100: 8.275, 12.412 and 16.549 ms, all bound by arithmetic -> "bf16".
    Do not modify the arguments. Errors: none to raise.
    """
    raise NotImplementedError("ch12.fastest_scheme: each scheme's bytes and FLOPs per step, then the roofline")
