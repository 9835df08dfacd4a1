"""Incremental detokenisation: turn a growing list of token ids into text deltas, safely.

Two traps make `decode(new_token)` wrong:
  * one character can span several byte-level tokens ("🙂" is four bytes); decoding half of it
    gives "\ufffd", so text is released only once it no longer ends in an incomplete character;
  * some tokenizers (SentencePiece) decode a token differently alone than after its neighbours,
    so each delta is `decode(context + new) - decode(context)`, with a few tokens of context.

Stop strings are handled here too: the text is cut before the earliest stop string in it (or, with
`include_stop_str`, after it), and text that could still turn out to be the start of a stop string
is held back until it cannot. With `min_tokens`, stop strings are looked for only in the text of the
tokens after the first min_tokens (the same rule as for EOS and stop tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from minillm.sampling import SamplingParams
from minillm.stopping import ends_on_stop_token

CONTEXT_TOKENS = 5  # tokens of left context used to decode each delta


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: Sequence[int] = (), stop: Sequence[str] = (),
                 include_stop_str: bool = False, skip_special_tokens: bool = True, min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] is the context of the next delta
        self.read_offset = len(self.ids)  # ids before this are already in `decoded`
        self.decoded = ""  # all generated text decoded so far (complete characters only)
        self.stop = tuple(stop)
        self.include_stop_str, self.skip_special_tokens = include_stop_str, skip_special_tokens
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.emitted = 0  # characters of `decoded` already released to the caller
        self.stopped_by: str | None = None  # the stop string that ended generation
        self.min_tokens, self.pushed = min_tokens, 0
        self.search_from = 0  # stop strings count from here on: the text after the first min_tokens tokens
        # A Hugging Face fast tokenizer decodes a stream itself (tokenizers' DecodeStream: each token once,
        # where `decode(context + new) - decode(context)` decodes it twice); other tokenizers take the rule below.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # (Not after a prompt that ends inside a character: the stream would release that character's
        # broken bytes with the first token; the rule below leaves the prompt's bytes to the prompt.)
        streamable = isinstance(self._backend, Tokenizer) and not self._decode(self.ids).endswith("\ufffd")
        self._stream = DecodeStream(ids=list(self.ids), skip_special_tokens=skip_special_tokens) \
            if streamable else None

    @classmethod
    def for_request(cls, tokenizer, prompt_ids: Sequence[int], params: SamplingParams) -> IncrementalDetokenizer:
        return cls(tokenizer, prompt_ids, params.stop, params.include_stop_str_in_output, params.skip_special_tokens,
                   params.min_tokens)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (possibly "")."""
        if self.stopped_by is not None:
            return ""
        if self.pushed == self.min_tokens:
            self.search_from = len(self.decoded)
        self.pushed += 1
        self.ids.append(token_id)
        if self._stream is not None:  # the same rule, in the tokenizers library: each token decoded once
            piece = self._stream.step(self._backend, token_id)
            if piece:
                self.decoded += piece
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return self._release(final=False)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.decoded += after[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._release(final=False)

    def push_output(self, output_ids: Sequence[int], params: SamplingParams, eos_token_ids) -> str:
        """Add the newest token of a request's output `output_ids`, unless it is a stop token whose text is
        left out of the output (EOS, a stop token id; kept with `include_stop_str_in_output`)."""
        if not params.include_stop_str_in_output and ends_on_stop_token(output_ids, params, eos_token_ids):
            return ""
        return self.push(output_ids[-1])

    def _release(self, final: bool) -> str:
        # A stop string can only start in text not yet released (that is what hold_back ensures), and
        # before min_tokens tokens were pushed, none is looked for.
        searching = self.pushed > self.min_tokens
        found = [(at, i) for i, s in enumerate(self.stop)
                 if searching and (at := self.decoded.find(s, max(self.emitted, self.search_from))) != -1]
        if found:  # the earliest in the text; at the same place, the first in the list
            at, i = min(found)
            self.stopped_by = self.stop[i]
            self.decoded = self.decoded[: at + len(self.stopped_by) if self.include_stop_str else at]
        end = len(self.decoded)
        if not (final or self.stopped_by) and searching:  # (before that, no stop string can start: release all)
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
