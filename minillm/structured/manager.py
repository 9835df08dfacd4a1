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
        self.pending: list[Request] = []  # submitted, their grammar not yet ready: a step with none does nothing here

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
        self.pending.append(request)

    def ready(self) -> list[tuple[Request, BaseException]]:
        """Give every pending request whose grammar has compiled its matchers (one per sample). Returns
        the requests whose grammar failed to compile, with why."""
        failed, still = [], []
        for request in self.pending:
            if not request.grammar.done():
                still.append(request)
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
        self.pending = still
        return failed

    def forget(self, request: Request) -> None:
        """`request` ended: if its grammar had not compiled, it waits no more, and the compilation is cancelled
        if it has not started and no other pending request shares it."""
        if request not in self.pending:
            return
        self.pending.remove(request)
        future = request.grammar
        if not future.done() and not any(r.grammar is future for r in self.pending):
            self.compiler.cancel(request.params.structured, future)

    def compiling(self) -> list[Future]:
        """The grammars pending requests still wait for (not compiled yet)."""
        return list({id(r.grammar): r.grammar for r in self.pending if not r.grammar.done()}.values())

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
