"""Solution of `ch12.fastest_scheme`."""


def step_ms(scheme, num_weights, kv_bytes_per_token, context_lengths, bandwidth_gb_s, tflops):
    """One decode step's time under the roofline: the slower of moving the bytes and doing the FLOPs."""
    weight_bytes = num_weights * scheme["bits"] / 8
    if scheme["group_size"] is not None:
        weight_bytes += num_weights / scheme["group_size"] * scheme["group_bytes"]
    moved = weight_bytes + sum(context_lengths) * kv_bytes_per_token
    flops = len(context_lengths) * num_weights * (2 + scheme["dequant_flops"])
    return 1000 * max(moved / (bandwidth_gb_s * 1e9), flops / (tflops * 1e12))


def fastest_scheme(schemes, num_weights, kv_bytes_per_token, context_lengths, bandwidth_gb_s, tflops):
    best, best_ms = None, float("inf")
    for name, scheme in schemes.items():
        ms = step_ms(scheme, num_weights, kv_bytes_per_token, context_lengths, bandwidth_gb_s, tflops)
        if ms < best_ms - 1e-9:  # strictly faster: among equal times the first stays
            best, best_ms = name, ms
    return best
