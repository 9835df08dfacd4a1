"""Chapter 6 exercise `ch06.chunked_step`: one step of the scheduler with chunked prefill."""


def plan_chunked_step(running: list[tuple[str, int]], waiting: list[tuple[str, int]], free_slots: int,
                      max_tokens_per_step: int, max_prefill_chunk: int) -> list[tuple[str, int]]:
    """Decide one step. Return what runs: [(request_id, num_tokens)], in the order granted.

    running: [(request_id, tokens it still needs)], oldest first — 1 for a request that is decoding,
             more for a prompt being prefilled in chunks.
    waiting: [(request_id, tokens it needs)] in arrival order.
    Rules (minillm/scheduler/continuous.py with chunked_prefill=True):
      1. decodes first: every running request that needs 1 token, oldest first, while budget is left;
      2. then the running requests that need more (prefills in progress), oldest first: each gets
         min(what it needs, max_prefill_chunk, what is left of the budget);
      3. then waiting requests in arrival order, while a slot is free and budget is left: each gets
         min(what it needs, max_prefill_chunk, what is left); stop at the first that gets nothing.
    A request granted nothing is left out of the list. Do not modify the arguments.
    """
    raise NotImplementedError("ch06.chunked_step: plan one chunked step under the token budget")
