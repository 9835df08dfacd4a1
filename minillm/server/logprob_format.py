"""Log-probabilities in the OpenAI API's shapes (chapter 9), from the engine's `TokenLogprob`s.

    completions  "logprobs": {"tokens": ["Hel", "lo"], "token_logprobs": [-0.1, -0.5],
                              "top_logprobs": [{"Hel": -0.1, "Hi": -2.3}, ...], "text_offset": [0, 3]}
                 with echo the prompt's tokens come first, the first of them with null logprob and top
    chat         "logprobs": {"content": [{"token": "Hel", "logprob": -0.1, "bytes": [72, 101, 108],
                              "top_logprobs": [{"token", "logprob", "bytes"}, ...]}], "refusal": null}
    vLLM's       "prompt_logprobs": [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...]

A token is named by its own decoded text (a byte-level token holding part of a character decodes to
"\ufffd"; chat's `bytes` are the token's own bytes, so such pieces join up again; in a completions dict
two tokens with one text share a key, which keeps the larger logprob). A completions `top_logprobs`
entry holds the N most likely tokens and the chosen one, as OpenAI and vLLM give it (so N + 1 entries
when the chosen token is not among the N). Values are the model's own log-softmax; -inf is written as
-9999.0, as vLLM does, since JSON has no infinity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from minillm.logprobs import TokenLogprob

FLOOR = -9999.0
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback: one raw byte per token


def _value(logprob: float) -> float:
    return max(logprob, FLOOR) if not math.isnan(logprob) else FLOOR


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE (GPT-2, Llama 3, Qwen) writes each byte as one printable character: that mapping
    reversed, character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class LogprobFormatter:
    """Names tokens with `tokenizer` (each id decoded once, then remembered) and builds the shapes."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._alphabet = _byte_level_alphabet() if type(decoder).__name__ == "ByteLevel" else None

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own bytes — exact for a byte-level tokenizer and for SentencePiece's byte pieces
        ("<0xC3>"), so the bytes of a character split across tokens join up again — else the UTF-8 of
        its text."""
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        piece = convert(token_id) if convert is not None else None
        if isinstance(piece, str) and (found := BYTE_PIECE.fullmatch(piece)):
            return [int(found.group(1), 16)]
        if self._alphabet is not None and isinstance(piece, str) and all(ch in self._alphabet for ch in piece):
            return [self._alphabet[ch] for ch in piece]
        return list(self.text(token_id).encode("utf-8"))

    def text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False,
                                                          clean_up_tokenization_spaces=False)
        return self._texts[token_id]

    def completion(self, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None], num_top: int,
                   text_offset: int = 0) -> dict:
        """Completions' `logprobs` object for these tokens; `entries[i]` is token i's (None: no logprob,
        the prompt's first token). Offsets count characters from `text_offset`."""
        tokens = [self.text(t) for t in token_ids]
        offsets = []
        for token in tokens:
            offsets.append(text_offset)
            text_offset += len(token)
        token_logprobs = [None if e is None else _value(e.logprob) for e in entries]
        top = [None if e is None else self._top_dict(e, num_top) for e in entries]
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

    def _top_dict(self, entry: TokenLogprob, num_top: int) -> dict[str, float]:
        """{text: logprob} of the top tokens and the chosen one. Two tokens can share a text (bytes of an
        unfinished character both read "\ufffd"): the key keeps the larger logprob, so the dict's largest
        value is still the model's largest (what a harness's "was it greedy" check compares with)."""
        top: dict[str, float] = {}
        for token_id, logprob in (*entry.top[:num_top], (entry.token_id, entry.logprob)):
            key = self.text(token_id)
            top[key] = max(top.get(key, FLOOR), _value(logprob))
        return top

    def chat(self, entries: Sequence[TokenLogprob], num_top: int) -> dict:
        """Chat's `logprobs` object: one item per token, with exactly `num_top` alternatives."""
        return {"content": [self._chat_item(e.token_id, e.logprob) | {"top_logprobs": [
            self._chat_item(token_id, logprob) for token_id, logprob in e.top[:num_top]]} for e in entries],
            "refusal": None}

    def _chat_item(self, token_id: int, logprob: float) -> dict:
        return {"token": self.text(token_id), "logprob": _value(logprob), "bytes": self.token_bytes(token_id)}

    def prompt_logprobs(self, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None],
                        num_top: int) -> list[dict | None]:
        """vLLM's `prompt_logprobs`: per prompt token, its own and the `num_top` top alternatives' logprob and
        rank, keyed by token id (as a string: JSON keys are strings)."""
        out: list[dict | None] = []
        for token_id, entry in zip(token_ids, entries):
            if entry is None:
                out.append(None)
                continue
            ranked = {token_id: (entry.logprob, entry.rank)}
            for rank, (other, logprob) in enumerate(entry.top[:num_top], start=1):
                ranked.setdefault(other, (logprob, rank))
            out.append({str(t): {"logprob": _value(lp), "rank": rank, "decoded_token": self.text(t)}
                        for t, (lp, rank) in ranked.items()})
        return out
