"""Solution of `ch11.token_mask`."""


def token_mask(transitions, accepting, state, vocab, eos_token_id):
    # live states: accepting ones, and every state with a move into a live one (repeat until nothing changes)
    live = set(accepting)
    changed = True
    while changed:
        changed = False
        for s, moves in transitions.items():
            if s not in live and any(t in live for t in moves.values()):
                live.add(s)
                changed = True
    words = [0] * ((len(vocab) + 31) // 32)
    for token, text in enumerate(vocab):
        if token == eos_token_id:
            allowed = state in accepting
        else:
            at = state if text else None
            for character in text:
                at = transitions.get(at, {}).get(character)
                if at is None:
                    break
            allowed = at is not None and at in live
        if allowed:
            words[token // 32] |= 1 << (token % 32)
    return words
