"""Prompts at the door: text or token ids in, checked token ids out.

Whatever could make a forward pass fail later — an id the embedding table has no row for, a
float or a bool posing as an id, text the tokenizer cannot encode, a prompt too long for the
context — is refused here with a ValueError that names the problem, before the request is queued.
"""

from __future__ import annotations

from collections.abc import Sequence

from minillm.sampling import is_int


def encode_prompt(tokenizer, prompt: str | Sequence[int], max_len: int, vocab_size: int | None = None) -> list[int]:
    """Token ids of a prompt: a `str`, or a list / tuple of integer token ids in [0, vocab_size).

    Raises ValueError for anything else, for an empty prompt, and for a prompt that leaves no room
    for one new token in `max_len`.
    """
    if isinstance(prompt, str):
        ids = _check_ids(_encode_text(tokenizer, prompt), vocab_size)  # a tokenizer may know more ids than the model
    elif isinstance(prompt, list | tuple):
        ids = _check_ids(prompt, vocab_size)
    else:
        hint = " (one prompt of token ids is a list: [[5, 6, 7]], not [5, 6, 7])" if is_int(prompt) else ""
        raise ValueError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}{hint}")
    if not ids:
        raise ValueError("prompt is empty: give at least one token")
    if len(ids) >= max_len:
        raise ValueError(f"prompt has {len(ids)} tokens; the context holds {max_len}, "
                         "which must also leave room for at least one new token")
    return ids


def _encode_text(tokenizer, text: str) -> list[int]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate such as "\ud800"
        raise ValueError(f"prompt is not valid Unicode text: {err.reason} at character {err.start}") from None
    try:
        return list(tokenizer.encode(text))
    except Exception as err:
        raise ValueError(f"the tokenizer could not encode the prompt: {type(err).__name__}: {err}") from None


def _check_ids(ids: Sequence, vocab_size: int | None) -> list[int]:
    for i, token in enumerate(ids):
        if not is_int(token):
            raise ValueError(f"prompt token ids must be integers, got {type(token).__name__} {token!r} at index {i}")
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ValueError(f"prompt token id {token} at index {i} is outside the vocabulary {bound}")
    return [int(t) for t in ids]
