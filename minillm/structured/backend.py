"""What the engine needs of a grammar library: two small interfaces, so another library can be plugged in.

The engine (minillm/structured/manager.py, step_masks.py) touches a library only through these:

    GrammarBackend   submit(constraint) -> Future of a compiled grammar (cached per constraint, off the step
                     loop); cancel(constraint, future) when nobody waits for it any more;
                     matcher(grammar) -> a fresh GrammarWalker; close()
    GrammarWalker    accept(token) / rollback(n) / fill(bitmask, row) / is_finished / jump_forward()

The bitmask is one bit per token, 32 tokens to an int32 word, token t at bit t % 32 of word t // 32 —
the layout xgrammar and llguidance both fill, so the step's mask and the C loop that applies it
(csrc/bitmask.c) serve either.

Why xgrammar (minillm/structured/grammars.py): it is vLLM's and SGLang's default; its CPU wheel runs
here; it compiles a JSON schema, a regex or an EBNF grammar ahead of time into a pushdown automaton whose
per-state token masks are mostly precomputed, so a mask fills in microseconds; and it offers rollback
(speculative decoding) and the forced text jump-forward needs. llguidance, the other library vLLM
offers, computes masks lazily with no compile step (better for schemas seen once) and has the same
operations; a `GrammarBackend` around it would slot in beside this one.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

import torch

from minillm.structured.constraint import StructuredOutput


class GrammarWalker(Protocol):
    """One request's (one sample's) walk through its compiled grammar."""

    def accept(self, token_id: int) -> bool: ...

    def rollback(self, num_tokens: int) -> None: ...

    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...

    @property
    def is_finished(self) -> bool: ...

    def jump_forward(self) -> str: ...


class GrammarBackend(Protocol):
    """Compiles constraints against one tokenizer, and starts walks through what it compiled."""

    def submit(self, constraint: StructuredOutput) -> Future: ...

    def cancel(self, constraint: StructuredOutput, future: Future) -> None: ...

    def matcher(self, grammar: Any) -> GrammarWalker: ...

    def close(self) -> None: ...
