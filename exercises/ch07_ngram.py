"""Chapter 7 exercise `ch07.ngram`: n-gram prompt lookup, a proposer without a model."""


def propose_ngram(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Guess the next tokens of a request from its own tokens (prompt and output so far).

    For n from n_max down to n_min: take the last n tokens; find the most recent EARLIER place where
    the same n tokens occur (it must start before the suffix starts; it may overlap it); if found,
    return up to k tokens that followed it (fewer if `tokens` ends first). If no n finds a match,
    return []. Ignore an n larger than len(tokens) - 1. Do not modify `tokens`.
    Example: tokens [1, 2, 3, 9, 1, 2], k 2, n_max 2, n_min 1 -> the last 2 tokens [1, 2] occurred
    at position 0, followed by [3, 9] -> return [3, 9].
    """
    raise NotImplementedError("ch07.ngram: find the last n tokens earlier in the request and propose what followed")
