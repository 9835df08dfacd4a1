"""Chapter 3 exercise `ch03.schedule_step`: one step of the continuous-batching scheduler."""


def plan_step(running: list[tuple[str, int]], waiting: list[tuple[str, int]], free_slots: int,
              max_tokens_per_step: int) -> tuple[list[tuple[str, int]], list[str]]:
    """Decide one step. Return (what runs: [(request_id, num_tokens)], admitted request ids).

    running: [(request_id, tokens it still needs)] in order — 1 for a request that is decoding.
    waiting: [(request_id, prompt length)] in arrival order.
    Rules (minillm/scheduler/continuous.py):
      1. go through `running` in order; a request runs if what it needs fits in the remaining
         token budget (otherwise it waits for the next step and the others go on);
      2. then admit waiting requests in arrival order while a slot is free and the whole prompt
         fits in the remaining budget; stop at the first one that does not fit (first come,
         first served: nobody overtakes).
    The list of what runs has the running requests first, then the admitted ones.
    """
    raise NotImplementedError("ch03.schedule_step: implement one scheduling step")
