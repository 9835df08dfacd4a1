"""Compiling constraints against the tokenizer, and the matcher each request walks its output with —
xgrammar behind the engine's two small interfaces (minillm/structured/backend.py, which says why xgrammar).

The library is xgrammar (vLLM's default backend; SGLang's too): it turns a JSON schema, a regex or an
EBNF grammar into a pushdown automaton over the tokenizer's vocabulary, and per step fills a bitmask
of the tokens allowed next (one bit per token) in a few µs, precomputing what it can per automaton
state. Compiling takes milliseconds to seconds for a large schema, so it runs on worker threads,
once per distinct constraint: `submit` returns a future that every request with an equal constraint
shares, and the step loop never waits for it (a request waits in the queue until its grammar is
ready — what vLLM does too).

    compiler = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)
    grammar = compiler.submit(StructuredOutput(regex=r"[0-9]+")).result()
    matcher = Matcher(grammar)            one per request (per sample)
    matcher.fill(bitmask, row)            the tokens allowed next, into row `row` of a step's bitmask
    matcher.accept(token)                 advance by the token the sampler chose
    matcher.rollback(n)                   undo the last n (guesses the target refused)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import re
import select
import signal
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xgrammar as xgr

from minillm import native
from minillm.structured.constraint import StructuredOutput, regex_for_library
from minillm.structured.schema_support import check_schema, schema_patterns

COMPILE_WORKERS = 4
MAX_JUMP_BYTES = 256  # the most forced text one jump-forward looks for (the engine keeps what fits its limits)
SANDBOX_TIMEOUT_S = 10.0  # the longest a grammar or a schema with counted repeats may compile (GrammarSandbox)
SANDBOX_START_S = 60.0  # the longest its process may take to start (importing the library on a busy machine)
MAX_CACHED = 256  # compiled grammars kept for requests to come (each holds its masks: tens of KB to MBs)


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Iterable[int] = ()):
        stop = sorted(set(eos_token_ids)) or None
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        # several workers: a constraint that takes long to compile holds up only requests with that constraint
        self._pool = ThreadPoolExecutor(max_workers=COMPILE_WORKERS, thread_name_prefix="grammar-compile")
        self._sandbox_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-sandbox")
        self._futures: OrderedDict[tuple[str, str], Future] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._sandbox = GrammarSandbox(self.info)
        self._first_bytes: np.ndarray | None = None  # Matcher.jump_forward's table, made once
        # the threads and the sandbox's process end with the compiler, if nobody closes it first
        self._close = weakref.finalize(self, _close, self._pool, self._sandbox_pool, self._sandbox)

    def submit(self, constraint: StructuredOutput) -> Future:
        """The compiled grammar of `constraint`, as a future: compiled once on the worker thread,
        shared by every equal constraint. A malformed one fails its future with a ValueError that
        gives the library's reason. The MAX_CACHED constraints used last stay compiled (and every one
        still compiling); older ones are compiled again when asked for again."""
        with self._lock:
            future = self._futures.get(constraint.key)
            if future is None or future.cancelled():
                pool = self._sandbox_pool if _sandboxed(constraint) else self._pool
                future = self._futures[constraint.key] = pool.submit(self._compile, constraint)
                self._evict()
            else:
                self._futures.move_to_end(constraint.key)
            return future

    def cancel(self, constraint: StructuredOutput, future: Future) -> None:
        """Nobody waits for `future` any more: if its compilation has not started, it never will (a client
        that sent thousands of constraints and left does not hold up the compilations of those after it)."""
        with self._lock:
            if future.cancel() and self._futures.get(constraint.key) is future:
                del self._futures[constraint.key]

    def _evict(self) -> None:
        """Forget the compiled (or failed) constraints used longest ago, beyond MAX_CACHED."""
        excess = len(self._futures) - MAX_CACHED
        if excess > 0:
            for key in [key for key, future in self._futures.items() if future.done()][:excess]:
                del self._futures[key]

    def compile(self, constraint: StructuredOutput) -> xgr.CompiledGrammar:
        """`submit(constraint).result()`: waits for it."""
        return self.submit(constraint).result()

    def _compile(self, constraint: StructuredOutput) -> xgr.CompiledGrammar:
        kind = constraint.kind
        if kind == "json":  # what the library would silently ignore is refused by name (schema_support.py)
            check_schema(constraint.json)
        try:
            if _sandboxed(constraint):
                text = constraint.grammar if kind == "grammar" else json.dumps(constraint.json)
                return self._sandbox.compile(kind, text)
            if kind == "json":
                return self._compiler.compile_json_schema(json.dumps(constraint.json), any_whitespace=False)
            if kind == "json_object":
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(regex_for_library(constraint.regex))
            if kind == "choice":  # one EBNF alternative per string, each a JSON-escaped literal
                alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in constraint.choice)
                return self._compiler.compile_grammar(f"root ::= {alternatives}")
            raise AssertionError(f"unknown constraint kind {kind!r}")
        except (RuntimeError, ValueError) as err:
            lines = str(err).strip().splitlines() or [type(err).__name__]
            reason = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", lines[-1])  # without "[time] file.cc:94: "
            raise ValueError(f"the {kind} constraint could not be compiled: {reason}") from None

    def matcher(self, grammar: xgr.CompiledGrammar) -> Matcher:
        """A fresh walk through `grammar` (one per request, per sample)."""
        if self._first_bytes is None:
            self._first_bytes = token_first_bytes(self.info)
        return Matcher(grammar, self._first_bytes)

    def close(self) -> None:
        self._close()


def _close(pool: ThreadPoolExecutor, sandbox_pool: ThreadPoolExecutor, sandbox: GrammarSandbox) -> None:
    for executor in (pool, sandbox_pool):
        executor.shutdown(wait=False, cancel_futures=True)
    sandbox.close()


def _sandboxed(constraint: StructuredOutput) -> bool:
    """Whether `constraint` compiles in the GrammarSandbox: a user's EBNF grammar, or a schema whose patterns
    hold counted repeats."""
    return constraint.kind == "grammar" or (constraint.kind == "json" and any(
        re.search(r"\{\d", pattern) for pattern in schema_patterns(constraint.json)))


_SANDBOX = """
import json, sys
import xgrammar as xgr
compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(sys.stdin.readline()), max_threads=1,
                               cache_enabled=False)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    kind, text = json.loads(line)
    try:
        grammar = compiler.compile_grammar(text) if kind == "grammar" else \\
            compiler.compile_json_schema(text, any_whitespace=False)
        print(json.dumps({"grammar": grammar.serialize_json()}), flush=True)
    except Exception as err:  # refused cleanly: the library's reason goes back
        print(json.dumps({"error": str(err) or type(err).__name__}), flush=True)
"""


class GrammarSandbox:
    """Constraints that can hurt the engine's process compiled in a separate one, under a deadline, and
    the compiled grammar sent back (serialized; milliseconds):
    - a user's EBNF grammar: some crash the library outright (xgrammar 0.2.9 segfaults on `root ::= root{2}`,
      `root ::= x{1}  x ::= root`...), which in the engine's process would end every request with it;
    - a JSON schema with counted repeats in a pattern (`[a-z]{1,100}`): the library writes them out, and
      nested ones grow with their product — `([a-z]{1,100}){1,100}` takes 8 s, `(.{1,30}){1,30}` 6.5 s on
      this course's CPU, while the same regex as a `regex` constraint takes milliseconds.
    The child (one, started when first needed, kept) compiles against the same vocabulary; one that dies,
    or takes over SANDBOX_TIMEOUT_S, is refused with that reason, and the next constraint starts a fresh
    child. The compiler runs it on a worker of its own, so that a slow one holds up only the others bound
    here, never the schemas, regexes and choices the library compiles safely in the engine's process."""

    def __init__(self, info: xgr.TokenizerInfo):
        self._info = info
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
        """Compile `text` ("grammar": EBNF, "json": a JSON schema) in the child. A RuntimeError with the
        library's reason when it refuses it; a ValueError when it kills the child or runs out of time."""
        with self._lock:
            process = self._process or self._start()
            try:
                process.stdin.write(json.dumps([kind, text]) + "\n")
                process.stdin.flush()
                answered = select.select([process.stdout], [], [], SANDBOX_TIMEOUT_S)[0]
                line = process.stdout.readline() if answered else None
            except OSError:  # the child is gone (it died on the previous constraint's heels, or at its start)
                line = ""
            if line:
                answer = json.loads(line)
                if "error" in answer:
                    raise RuntimeError(answer["error"])
                return xgr.CompiledGrammar.deserialize_json(answer["grammar"], self._info)
            code = self._stop()
            if line is None:
                raise ValueError(f"it took longer than {SANDBOX_TIMEOUT_S:g} s to compile (in a separate process: "
                                 "stopped there)")
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            raise ValueError(f"it crashes the grammar library (the compilation, in a separate process, ended with "
                             f"{how})")

    def _start(self) -> subprocess.Popen:
        """A fresh child, once it has read the vocabulary (its start is not part of any deadline)."""
        self._process = subprocess.Popen([sys.executable, "-c", _SANDBOX], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._process.stdin.write(self._info.serialize_json() + "\n")
        self._process.stdin.flush()
        if not select.select([self._process.stdout], [], [], SANDBOX_START_S)[0] or \
                not self._process.stdout.readline():
            self._stop()
            raise ValueError(f"the separate process that compiles it did not start within {SANDBOX_START_S:g} s")
        return self._process

    def _stop(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        process.kill()
        try:
            return process.wait(5)
        except subprocess.TimeoutExpired:
            return None
        finally:
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    stream.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """(rows, ceil(vocab / 32)) int32, every token allowed: the step's mask, one row per sampling row."""
    return xgr.allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None = None) -> None:
    """Disallowed tokens' logits to -inf, in place. logits: (n, vocab); `rows`: which of them (default all).
    On the CPU a small C loop (csrc/bitmask.c) when it builds; elsewhere the library's kernel."""
    rows = list(range(logits.shape[0])) if rows is None else rows
    library = _bitmask_library()
    if (logits.is_cpu and logits.dtype is torch.float32 and logits.stride(-1) == 1 and bitmask.is_contiguous()
            and not isinstance(library, str)):
        library.apply_bitmask_f32(logits.data_ptr(), logits.stride(0), bitmask.data_ptr(), bitmask.shape[-1],
                                  (ctypes.c_long * len(rows))(*rows), len(rows), logits.shape[-1])
        return
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)


@functools.cache
def _bitmask_library() -> ctypes.CDLL | str:
    """The C mask loop, or why there is none (then the library's routine runs)."""
    library = native.load(Path(__file__).with_name("csrc") / "bitmask.c")
    if not isinstance(library, str):
        _P, _L = ctypes.c_void_p, ctypes.c_long
        library.apply_bitmask_f32.argtypes = [_P, _L, _P, _L, _P, _L, _L]
        library.apply_bitmask_f32.restype = None
    return library


class Matcher:
    """One request's walk through its grammar."""

    def __init__(self, grammar: xgr.CompiledGrammar, first_bytes: np.ndarray | None = None):
        self._matcher = xgr.GrammarMatcher(grammar)  # rollback is unlimited
        self._grammar = grammar
        self._first_bytes = first_bytes  # jump_forward's table (token_first_bytes), made on first use if not given
        self._probe: torch.Tensor | None = None  # its one-row bitmask

    def accept(self, token_id: int) -> bool:
        """Advance by `token_id`; False (and no change) when the grammar does not allow it."""
        return self._matcher.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of `bitmask`: the tokens allowed next (an end-of-sequence token once complete)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_finished(self) -> bool:
        """The output is complete and its end-of-sequence token accepted."""
        return self._matcher.is_terminated()

    def jump_forward(self, max_bytes: int = MAX_JUMP_BYTES) -> str:
        """The text every allowed continuation starts with (empty when there is a choice to make), at most
        `max_bytes` long, in whole UTF-8 characters. The library's own search (find_jump_forward_string)
        has no bound: a grammar that forces text forever (root ::= "a" root; a schema whose required
        property is itself) fills memory until the process dies. So the forced bytes are found here one at a
        time: the tokens the grammar allows next all start with the same byte (no end-of-sequence among them)
        — with a byte-level vocabulary, where every byte is a token, exactly when that byte is the only one
        allowed; otherwise the byte any token the model could take starts with. Each is accepted, and all
        are rolled back at the end: the matcher is left as it was."""
        if self._first_bytes is None:
            self._first_bytes = token_first_bytes(self._grammar.tokenizer_info)
        firsts = self._first_bytes
        if self._probe is None:
            self._probe = allocate_bitmask(1, len(firsts))
        forced = bytearray()
        try:
            while len(forced) < max_bytes and not self._matcher.is_terminated():
                self._matcher.fill_next_token_bitmask(self._probe, 0)
                bits = np.unpackbits(self._probe[0].numpy().astype("<i4").view(np.uint8), bitorder="little")
                allowed = firsts[bits[: len(firsts)].view(bool)]  # bit t % 32 of word t // 32: token t
                if not len(allowed) or allowed.min() < 0 or allowed.min() != allowed.max():
                    break  # nothing, the end, or a choice
                if not self._matcher.accept_string(bytes([int(allowed[0])])):
                    break
                forced.append(int(allowed[0]))
        finally:
            if forced:
                self._matcher.rollback(len(forced))  # each accept_string is one step back
        return _whole_characters(bytes(forced))


def token_first_bytes(info: xgr.TokenizerInfo) -> np.ndarray:
    """(vocab,) int16: each token's first byte, -1 for a token that cannot be told from its first byte (stop and
    special tokens, empty ones): jump_forward stops where one of them is allowed."""
    firsts = np.array([token[0] if token else -1 for token in info.decoded_vocab], dtype=np.int16)
    special = [t for t in (*info.stop_token_ids, *info.special_token_ids) if 0 <= t < len(firsts)]
    firsts[special] = -1
    return firsts


def _whole_characters(data: bytes) -> str:
    """The leading whole UTF-8 characters of `data` (none when it starts inside one)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        return data[: err.start].decode("utf-8")
