"""Solution of `ch02.slot_utilisation`."""


def slot_utilisation(steps: list[list[int]], num_slots: int) -> float:
    if not steps:
        return 0.0
    busy = sum(1 for step in steps for tokens in step if tokens > 0)
    return busy / (len(steps) * num_slots)
