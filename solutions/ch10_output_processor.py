"""Solution of `ch10.output_processor`."""

from minillm.engine_core.messages import AbortRequest


class OutputProcessor:
    def __init__(self, request_id, decode, stop):
        self.request_id, self.decode, self.stop = request_id, decode, list(stop)
        self.pending: list[int] = []  # tokens whose text does not end on a complete character yet
        self.text = ""  # the text of every token decoded so far (cut at a stop string)
        self.released = 0  # characters of `text` already returned
        self.finish_reason = None

    def process(self, token_ids, finish_reason):
        if self.finish_reason is not None:  # tokens in flight when the core heard of the end: not ours
            return "", self.finish_reason, None
        self._add_tokens(token_ids, last=finish_reason is not None)
        at = self._stop_at()
        if at is not None:
            delta, self.text, self.released = self.text[self.released : at], self.text[:at], at
            self.finish_reason = "stop"
            return delta, "stop", AbortRequest(self.request_id)
        end = len(self.text)
        if finish_reason is not None:
            self.finish_reason = finish_reason
        else:
            end -= self._could_become_a_stop_string()
        delta, self.released = self.text[self.released : end], end
        return delta, self.finish_reason, None

    def _add_tokens(self, token_ids, last):
        """Decode each token once, with the few before it whose character it completes."""
        for token in token_ids:
            self.pending.append(token)
            piece = self.decode(self.pending)
            if not piece.endswith("\ufffd"):
                self.text, self.pending = self.text + piece, []
        if last and self.pending:  # the end: an incomplete character as decode gives it
            self.text, self.pending = self.text + self.decode(self.pending), []

    def _stop_at(self):
        """Where the earliest stop string starts, or None. One can only start in text not yet released:
        whatever could begin one was held back."""
        return min((at for s in self.stop if (at := self.text.find(s, self.released)) != -1), default=None)

    def _could_become_a_stop_string(self):
        """The length of the longest end of the unreleased text that some stop string begins with."""
        tail = self.text[self.released :]
        for k in range(min(len(tail), max((len(s) for s in self.stop), default=0)), 0, -1):
            if any(s.startswith(tail[-k:]) for s in self.stop):
                return k
        return 0
