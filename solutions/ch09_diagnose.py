"""Solution of `ch09.diagnose`."""


def diagnose():
    return {
        "server_a": {"cause": "KV cache too small", "fix": {"num_blocks": 1024}},  # preemptions by the hundred
        "server_b": {"cause": "a shared prefix is computed again for every request",
                     "fix": {"prefix_cache": True}},  # almost every step's tokens are prompt tokens
        "server_c": {"cause": "too few batch slots", "fix": {"max_num_seqs": 16}},  # 2 slots: a queue of hundreds
        "server_d": {"cause": "long prompts stall the decodes",  # the ITL p99 is one long prefill step
                     "fix": {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 256}},
    }
