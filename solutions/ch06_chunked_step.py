"""Solution of `ch06.chunked_step`."""


def plan_chunked_step(running: list[tuple[str, int]], waiting: list[tuple[str, int]], free_slots: int,
                      max_tokens_per_step: int, max_prefill_chunk: int) -> list[tuple[str, int]]:
    budget = max_tokens_per_step
    plan: list[tuple[str, int]] = []
    decodes = [r for r in running if r[1] == 1]
    prefills = [r for r in running if r[1] > 1]
    for request_id, need in decodes + prefills:  # decodes first; each group keeps its order
        grant = min(need, max_prefill_chunk, budget)
        if grant > 0:
            plan.append((request_id, grant))
            budget -= grant
    for request_id, need in waiting:
        grant = min(need, max_prefill_chunk, budget)
        if free_slots == 0 or grant == 0:
            break
        plan.append((request_id, grant))
        budget -= grant
        free_slots -= 1
    return plan
