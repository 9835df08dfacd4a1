"""Solution of `ch13.allreduce_points` and `ch13.allreduce_bytes`."""

OP_KINDS = {
    "input_layernorm": "replicated", "post_attention_layernorm": "replicated", "residual_add": "replicated",
    "qkv_proj": "column", "gate_up_proj": "column",
    "rope": "local", "attention": "local", "silu_mul": "local",
    "o_proj": "row", "down_proj": "row",
}


def allreduce_points(block):
    points = []
    for i, op in enumerate(block):
        if op not in OP_KINDS:
            raise ValueError(f"unknown operation {op!r}; known: {sorted(OP_KINDS)}")
        if OP_KINDS[op] == "row":  # its output is a partial sum: sum it before anything reads it
            points.append(i)
    return points


def allreduce_bytes(num_tokens, hidden_size, dtype_bytes, num_layers):
    per_allreduce = num_tokens * hidden_size * dtype_bytes  # the hidden states of every token
    return 2 * num_layers * per_allreduce  # after o_proj and after down_proj
