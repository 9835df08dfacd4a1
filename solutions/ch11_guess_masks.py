"""Solution of `ch11.guess_masks`."""


def guess_masks(matcher, guesses):
    masks = [set(matcher.allowed())]
    accepted = 0
    for guess in guesses:
        if not matcher.accept(guess):
            break
        accepted += 1
        if matcher.is_finished:  # nothing may follow an end-of-sequence token
            break
        masks.append(set(matcher.allowed()))
    if accepted:
        matcher.rollback(accepted)
    return masks + [None] * (len(guesses) + 1 - len(masks))
