"""Solution of `ch07.acceptance`."""

from collections.abc import Callable


def accept_drafts(drafted: list[int], p: list[list[float]], q: list[list[float]] | None, uniforms: list[float],
                  draw: Callable[[list[float]], int]) -> list[int]:
    kept: list[int] = []
    for i, guess in enumerate(drafted):
        q_i = q[i] if q is not None else [1.0 if t == guess else 0.0 for t in range(len(p[i]))]
        if q_i[guess] > 0 and uniforms[i] < min(1.0, p[i][guess] / q_i[guess]):
            kept.append(guess)
            continue
        residual = [max(0.0, a - b) for a, b in zip(p[i], q_i)]
        total = sum(residual)
        return kept + [draw([r / total for r in residual] if total > 0 else list(p[i]))]
    return kept + [draw(list(p[len(drafted)]))]
