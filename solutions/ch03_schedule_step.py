"""Solution of `ch03.schedule_step`."""


def plan_step(running: list[tuple[str, int]], waiting: list[tuple[str, int]], free_slots: int,
              max_tokens_per_step: int) -> tuple[list[tuple[str, int]], list[str]]:
    budget = max_tokens_per_step
    runs: list[tuple[str, int]] = []
    for request_id, need in running:
        if need <= budget:
            runs.append((request_id, need))
            budget -= need
    admitted: list[str] = []
    for request_id, prompt_len in waiting:
        if free_slots == 0 or prompt_len > budget:
            break
        runs.append((request_id, prompt_len))
        admitted.append(request_id)
        budget -= prompt_len
        free_slots -= 1
    return runs, admitted
