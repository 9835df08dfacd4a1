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

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(tokens: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the last n tokens, for the
    largest n in [n_min, n_max] that has one; [] when nothing matches. A match may overlap the
    suffix itself (only its start must be earlier), and the proposal stops at the end of `tokens`.

    The search, for each n, compares every earlier window of n tokens with the suffix at once (numpy:
    one pass in C over the history, where a Python loop took ~2.4 ms per request and step at 8k tokens):

        windows of n=2 over  a b c a b | c   (starts 0 .. len - n - 1: never the suffix itself)
        suffix  = b c        hits where all n columns equal -> the last hit is the most recent match
    """
    if k < 1 or n_min < 1 or n_max < n_min:
        raise ValueError(f"need k >= 1 and 1 <= n_min <= n_max, got k={k}, n_min={n_min}, n_max={n_max}")
    ids = np.asarray(tokens, dtype=np.int64)
    for n in range(min(n_max, len(ids) - 1), n_min - 1, -1):
        windows = sliding_window_view(ids[:-1], n)  # (len - n, n): window i is ids[i : i + n]
        hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return ids[start : start + k].tolist()
    return []
