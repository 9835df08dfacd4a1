"""The engine's side of structured outputs: compile at the door, admit when ready, follow every token.

    add_request ─► submit: its grammar compiles on the compiler's thread (a future; equal constraints
                   share one) — the request waits in the queue meanwhile, and only it waits
    each step   ─► ready: a waiting request whose grammar is compiled gets one matcher per sample and
                   may be admitted; one whose grammar failed to compile ends with the library's reason
    sampling    ─► the step's bitmask, from each row's matcher (minillm/structured/step_masks.py)
    each token  ─► advance: the matcher follows the tokens the request keeps; once its grammar is
                   complete (its end-of-sequence token accepted) the request stops

A preempted request keeps its output tokens, and so its matcher stays where it was: it recomputes its
K/V, not its walk through the grammar.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait

from minillm.request import Request
from minillm.structured.backend import GrammarBackend

GRAMMAR_WAIT_S = 0.05  # the longest an engine with nothing else to do waits for a grammar per step


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Iterable[int]):
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, tuple(eos_token_ids)
        self._compiler = None  # made on the first constraint: loading the library costs a second

    @property
    def compiler(self) -> GrammarBackend:
        if self._compiler is None:
            from minillm.structured.grammars import GrammarCompiler

            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._compiler

    def submit(self, request: Request) -> None:
        """Start compiling the request's constraint (or share an equal one's compilation)."""
        future = self.compiler.submit(request.params.structured)
        for sample in request.samples:
            sample.grammar = future

    def ready(self, waiting: Iterable[Request]) -> list[tuple[Request, BaseException]]:
        """Give every waiting request whose grammar has compiled its matchers (one per sample). Returns
        the requests whose grammar failed to compile, with why."""
        failed = []
        for request in waiting:
            if request.is_ready or not request.grammar.done():
                continue
            error = request.grammar.exception() if not request.grammar.cancelled() else RuntimeError(
                "the structured output's compilation was cancelled")
            if error is not None:
                failed.append((request, error))
                continue
            try:
                matchers = [self.compiler.matcher(request.grammar.result()) for _ in request.samples]
            except Exception as err:  # the library cannot start a walk through it: this request alone fails
                failed.append((request, err))
                continue
            for sample, matcher in zip(request.samples, matchers):
                sample.matcher = matcher
        return failed

    def forget(self, request: Request, waiting: Iterable[Request]) -> None:
        """`request` ended before its grammar compiled: unless a waiting request shares the compilation,
        it is cancelled if it has not started."""
        future = request.grammar
        if future is not None and not future.done() and not any(r.grammar is future for r in waiting):
            self.compiler.cancel(request.params.structured, future)

    @staticmethod
    def compiling(waiting: Iterable[Request]) -> list[Future]:
        """The grammars the waiting requests still wait for (not compiled yet)."""
        return list({id(r.grammar): r.grammar for r in waiting if not r.is_ready and not r.grammar.done()}.values())

    @staticmethod
    def wait(futures: list[Future], timeout: float = GRAMMAR_WAIT_S) -> None:
        """Block until one of `futures` is done, or `timeout` seconds."""
        wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    @staticmethod
    def advance(request: Request, token_id: int) -> None:
        """The request keeps `token_id`: its matcher follows. A token the grammar refuses cannot come
        from the masked sampler; if one does, the request fails rather than break its constraint."""
        if not request.matcher.accept(token_id):
            raise ValueError(f"the structured output's grammar refused token {token_id} — the engine's mask "
                             "should have excluded it")

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
