"""N-gram prompt lookup: a proposer without a model.

Text often repeats itself — a summary quotes its document, code repeats its identifiers, an answer
copies from the prompt. So: take the request's last n tokens, find where the same n tokens occurred
earlier in the request (prompt and output), and propose the tokens that followed them there.

    tokens:   ... the quick brown fox jumps over ... the quick brown  ?
                      ^^^^^^^^^^^^^^^ earlier match (n = 3)  ^^^^^^^^^^^^^^^ last 3 tokens
    proposal: fox jumps over   (up to k tokens that followed the match)

Longer n first (a longer match is a better predictor); for each n the most recent earlier match.
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(tokens: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the last n tokens, for the
    largest n in [n_min, n_max] that has one; [] when nothing matches. A match may overlap the
    suffix itself (only its start must be earlier), and the proposal stops at the end of `tokens`."""
    if k < 1 or n_min < 1 or n_max < n_min:
        raise ValueError(f"need k >= 1 and 1 <= n_min <= n_max, got k={k}, n_min={n_min}, n_max={n_max}")
    tokens = list(tokens)
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # most recent first, never the suffix itself
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []
