"""Prompts at the door: text or token ids in, checked token ids out.

Whatever could make a forward pass fail later — an id the embedding table has no row for, a
float or a bool posing as an id, text the tokenizer cannot encode, a prompt too long for the
context — is refused here with a ValueError that names the problem, before the request is queued.

A list of ids longer than the context is refused by its length before any id is looked at, and a
text longer than `max_len` x `longest_token_chars(...)` characters cannot fit whatever its tokens
are (`check_text_length`): so even a prompt of megabytes costs next to nothing to refuse.
"""

from __future__ import annotations

from collections.abc import Sequence

from minillm.sampling import is_int


def encode_prompt(tokenizer, prompt: str | Sequence[int], max_len: int, vocab_size: int | None = None,
                  add_special_tokens: bool = True) -> list[int]:
    """Token ids of a prompt: a `str`, or a list / tuple of integer token ids in [0, vocab_size).

    A text is encoded with the tokenizer's special tokens (a BOS...) unless `add_special_tokens` is
    False — as for a chat template's output, which writes its own. Raises ValueError for anything
    else, for an empty prompt, and for a prompt that leaves no room for one new token in `max_len`.
    """
    if isinstance(prompt, str):
        # a tokenizer may know more ids than the model
        ids = _check_ids(_encode_text(tokenizer, prompt, add_special_tokens), vocab_size)
    elif isinstance(prompt, list | tuple):
        _check_length(len(prompt), max_len)  # before looking at a million ids
        ids = _check_ids(prompt, vocab_size)
    else:
        hint = " (one prompt of token ids is a list: [[5, 6, 7]], not [5, 6, 7])" if is_int(prompt) else ""
        raise ValueError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}{hint}")
    _check_length(len(ids), max_len)
    return ids


def longest_token_chars(tokenizer, vocab_size: int) -> int:
    """The most characters one token decodes to: a text longer than max_len times this cannot fit.
    Decodes every id once (a worker thread's job for a large vocabulary)."""
    try:
        return max(1, max(len(tokenizer.decode([i])) for i in range(vocab_size)))
    except Exception:  # a tokenizer that cannot decode every id alone: fall back to a generous bound
        return 64


def check_text_length(text: str, max_len: int, chars_per_token: int) -> None:
    """Refuse, without tokenizing it, a text too long to fit `max_len` tokens whatever its tokens."""
    if len(text) > max_len * chars_per_token:
        raise ValueError(f"prompt has {len(text)} characters: more than the context of {max_len} tokens can hold")


def _check_length(num_tokens: int, max_len: int) -> None:
    if num_tokens == 0:
        raise ValueError("prompt is empty: give at least one token")
    if num_tokens >= max_len:
        raise ValueError(f"prompt has {num_tokens} tokens; the context holds {max_len}, "
                         "which must also leave room for at least one new token")


def _encode_text(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate such as "\ud800"
        raise ValueError(f"prompt is not valid Unicode text: {err.reason} at character {err.start}") from None
    try:
        if add_special_tokens:
            return list(tokenizer.encode(text))
        try:
            return list(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:  # a plain tokenizer without the option adds no special tokens anyway
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
