"""Chapter 2 exercise `ch02.slot_utilisation`: how much of the batch did useful work?"""


def slot_utilisation(steps: list[list[int]], num_slots: int) -> float:
    """Fraction of slot-steps that ran at least one token.

    steps: for each engine step, the number of tokens each slot ran, e.g. [[12, 5, 0, 1], ...]
           (0 = the slot was free or held but idle). A list may be shorter than num_slots: the
           missing slots ran nothing.
    Return busy slot-steps / (number of steps × num_slots), and 0.0 when there are no steps.
    """
    raise NotImplementedError("ch02.slot_utilisation: count the busy slot-steps")
