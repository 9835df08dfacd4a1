"""Chapter 6 exercise `ch06.choose_chunk`: the chunk size for an inter-token-latency target, from the
fitted step-cost model."""


def choose_chunk(cost: tuple[float, float, float], decode_contexts: list[int], prompt_len: int,
                 itl_target: float, sizes: list[int]) -> int | None:
    """The chunk size from `sizes` that gives the long prompt its earliest first token while no step
    of its prefill takes longer than `itl_target`; None if no size keeps every step within it.

    cost: (p0, p1, p2): a step that computes `tokens` tokens and `pairs` attention pairs takes
          p0 + p1 * tokens + p2 * pairs (in the unit of itl_target).
    decode_contexts: the requests decoding while the prompt is prefilled, by their context in the
          prompt's first step. Each decodes one token in every step of the prompt: 1 token and c pairs
          at context c, and its context is one longer in the next step.
    prompt_len: the prompt's tokens (none cached), cut into chunks of the chosen size: every step runs
          the next min(size, what is left) of them. A chunk of n tokens starting at position s is n
          tokens and n * s + n * (n + 1) // 2 pairs.
    sizes: the chunk sizes allowed (ints >= 1, any order). Do not modify the lists.

    A step exactly at the target is within it. The prompt's first token comes at the end of its last
    step: after the sum of its steps' times. Where several sizes give the same first-token time,
    return the one whose heaviest step is the lightest (the smaller size if that ties too).
    """
    raise NotImplementedError("ch06.choose_chunk: pick the chunk size from the step-cost model")
