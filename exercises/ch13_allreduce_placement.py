"""Chapter 13 exercises `ch13.allreduce_points` and `ch13.allreduce_bytes`: where a decoder block under
tensor parallelism must sum its ranks' partial results, and how many bytes that moves."""

# What each operation of a decoder block is under Megatron-style tensor parallelism (the notebook's table).
OP_KINDS = {
    "input_layernorm": "replicated", "post_attention_layernorm": "replicated", "residual_add": "replicated",
    "qkv_proj": "column", "gate_up_proj": "column",
    "rope": "local", "attention": "local", "silu_mul": "local",
    "o_proj": "row", "down_proj": "row",
}


def allreduce_points(block: list[str]) -> list[int]:
    """The positions in `block` after which the ranks must all-reduce (sum) their values.

    block: the names of a model's operations in the order they run (one decoder block, several blocks
    one after another, or a part of one), each a key of OP_KINDS. Do not modify it. The kinds:
        "column"      column-parallel linear (qkv_proj, gate_up_proj): reads the whole input, which every rank
                      holds, and writes the rank's own share of the outputs — whole, final values.
        "local"       per head or per element (rope, attention, silu_mul): works on the rank's own heads or
                      columns only, and needs nothing from the other ranks.
        "row"         row-parallel linear (o_proj, down_proj): reads the rank's share of the inputs and writes
                      a PARTIAL SUM of the whole output; the ranks' partials must be added up.
        "replicated"  norms and residual_add: every rank computes the same thing on the whole hidden state,
                      so it needs the full, summed values (adding the residual to each rank's partial sum
                      would count the residual once per rank).
    An all-reduce sums a tensor over the ranks and leaves the sum on every rank. Place the fewest that keep
    the results exact, each as early as it can run: return, in increasing order, the indices i such that an
    all-reduce runs right after block[i].
    Example: ["input_layernorm", "qkv_proj", "rope", "attention", "o_proj", "residual_add",
    "post_attention_layernorm", "gate_up_proj", "silu_mul", "down_proj", "residual_add"] -> [4, 9].
    An empty block -> [].
    Errors: ValueError naming the operation, for a name that is not a key of OP_KINDS.
    """
    raise NotImplementedError("ch13.allreduce_points: which operations leave partial sums behind?")


def allreduce_bytes(num_tokens: int, hidden_size: int, dtype_bytes: int, num_layers: int) -> int:
    """The bytes each rank contributes to the all-reduces of one forward pass over `num_tokens` tokens.

    The model has num_layers decoder blocks like the example of allreduce_points: each all-reduce sums the
    hidden states of the num_tokens tokens, num_tokens * hidden_size numbers of dtype_bytes bytes each (2 for
    bf16, 4 for float32), and each rank puts in its whole tensor. Count the all-reduces of the decoder blocks
    only: not the embedding's, nor the gathering of the logits. (The bytes a rank contributes do not depend on
    the number of ranks; how long the all-reduce takes does, and on the link.)
    Return an int. Example: Llama-3-8B (hidden_size 4096, 32 layers, bf16): one decode token -> 524288 bytes
    (512 KiB); a prefill of 2000 tokens -> 1048576000 bytes. The shipped model (hidden_size 256, 8 layers,
    float32) over 100 tokens -> 1638400.
    Errors: none to raise.
    """
    raise NotImplementedError("ch13.allreduce_bytes: how many all-reduces per block, and how large is each?")
