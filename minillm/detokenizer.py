"""Incremental detokenisation: turn a growing list of token ids into text deltas, safely.

Two traps make `decode(new_token)` wrong:
  * one character can span several byte-level tokens ("🙂" is four bytes); decoding half of it
    gives "\ufffd", so text is released only once it no longer ends in an incomplete character;
  * some tokenizers (SentencePiece) decode a token differently alone than after its neighbours,
    so each delta is `decode(context + new) - decode(context)`, with a few tokens of context.

Stop strings are handled here too: the text is cut before the first stop string, and text that
could still turn out to be the start of a stop string is held back until it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

CONTEXT_TOKENS = 5  # tokens of left context used to decode each delta


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: Sequence[int] = (), stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] is the context of the next delta
        self.read_offset = len(self.ids)  # ids before this are already in `decoded`
        self.decoded = ""  # all generated text decoded so far (complete characters only)
        self.stop = tuple(stop)
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.emitted = 0  # characters of `decoded` already released to the caller
        self.stopped_by: str | None = None  # the stop string that ended generation

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (possibly "")."""
        if self.stopped_by is not None:
            return ""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.decoded += after[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._release(final=False)

    def _release(self, final: bool) -> str:
        # A stop string can only start in text not yet released (that is what hold_back ensures).
        for s in self.stop:
            at = self.decoded.find(s, self.emitted)
            if at != -1:
                self.decoded, self.stopped_by = self.decoded[:at], s
        end = len(self.decoded)
        if not (final or self.stopped_by):
            end = max(self.emitted, end - self.hold_back)
        delta, self.emitted = self.decoded[self.emitted : end], end
        return delta

    def flush(self) -> str:
        """At the end of generation: release what was held back, even an incomplete character."""
        if self.stopped_by is None and self.read_offset < len(self.ids):
            before = self._decode(self.ids[self.prefix_offset : self.read_offset])
            self.decoded += self._decode(self.ids[self.prefix_offset :])[len(before) :]
            self.prefix_offset = self.read_offset = len(self.ids)
        return self._release(final=True)

    @property
    def text(self) -> str:
        return self.decoded
