"""A request's constraint compiled in the server before the request is queued (chapter 11).

A schema, regex or grammar the grammar library refuses is the client's mistake: a 400 with the
library's reason, as soon as possible, rather than a request that fails in the engine. So the
server compiles it too, with its own compiler over the same tokenizer: the engine core may be in
another process, and each side compiles a distinct constraint once (the compiler keeps it).

    await GrammarCheck(tokenizer, vocab_size, eos_token_ids).check(constraint)    ValueError: why not

Nothing here runs on the event loop: the compiler is built in a worker thread on first use (loading
the library and reading the vocabulary take about a second), the compile runs on the compiler's own
threads, and the loop only awaits its future. A grammar that allows no token at all from the start
(an empty language, such as `root ::= root "a"`) is refused too: the engine could only fail it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from minillm.structured import StructuredOutput


class GrammarCheck:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Iterable[int]):
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, tuple(eos_token_ids)
        self._compiler = None
        self._unavailable: str | None = None  # why the compiler could not be built (the tokenizer, say)
        self._lock = asyncio.Lock()

    async def check(self, constraint: StructuredOutput) -> None:
        """Return once `constraint` compiled; a ValueError with the reason if it does not."""
        compiler = await self._ready()
        # shielded: a client that leaves must not cancel the compilation, which equal constraints share
        grammar = await asyncio.shield(asyncio.wrap_future(compiler.submit(constraint)))
        if not await asyncio.to_thread(_allows_a_token, compiler, grammar, self.vocab_size):
            raise ValueError(f"the {constraint.kind} constraint allows no output at all: no token can begin it")

    async def _ready(self):
        async with self._lock:
            if self._compiler is None and self._unavailable is None:
                try:  # importing the library is part of the second spent off the loop
                    self._compiler = await asyncio.to_thread(_compiler, self.tokenizer, self.vocab_size,
                                                             self.eos_token_ids)
                except Exception as err:  # the grammar library cannot read this tokenizer, say
                    self._unavailable = f"{type(err).__name__}: {err}"
        if self._unavailable is not None:
            raise ValueError(f"structured outputs are unavailable on this server: {self._unavailable}")
        return self._compiler

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()


def _compiler(tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]):
    from minillm.structured.grammars import GrammarCompiler

    return GrammarCompiler(tokenizer, vocab_size, eos_token_ids)


def _allows_a_token(compiler, grammar, vocab_size: int) -> bool:
    from minillm.structured.grammars import allocate_bitmask

    bitmask = allocate_bitmask(1, vocab_size)
    compiler.matcher(grammar).fill(bitmask, 0)
    return bool(bitmask.any())
