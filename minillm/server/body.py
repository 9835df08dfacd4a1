"""Request bodies: read with a bound, parsed and checked off the event loop (chapter 9).

    bytes arrive ─► counted as they arrive: past MAX_BODY_BYTES ─► 413 at once, connection closed
                 ─► a body under 256 KiB: json.loads and protocol.py's checks in a worker thread
                 ─► a larger one: json.loads in a helper process (parse_worker.py), then the checks
                    in a worker thread

The bound holds whatever the transfer encoding: a declared Content-Length over it is refused before
a byte is read, and a chunked body (no length) is read piece by piece and refused as soon as it
passes the bound, so a client streaming a gigabyte costs the server a few megabytes at most.

Why a process for large bodies: json.loads is one C call that keeps Python's interpreter lock (the
GIL) throughout, ~50 ms for a list of a million token ids, and any thread busy with Python makes
every other thread wait up to 5 ms (sys.getswitchinterval) each time it wants the lock back — the
engine's step thread wants it back after every tensor operation. Three clients sending such bodies
in a loop, parsed in worker threads, stretched another client's inter-token gaps from 5 ms to
300 ms (tests/test_server_hostile.py). The helper process shares no lock with the engine; a value
with a list or object longer than any request can use (`max_items`) comes back as its path and size
only, and is refused by name. Should the helper fail, the body is parsed in a thread after all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request

from minillm.server.parse_worker import ParseWorker
from minillm.server.protocol import RequestError

MAX_BODY_BYTES = 4 << 20  # 4 MiB: far more than any prompt the context can hold, far less than a flood
PROCESS_BODY_BYTES = 256 << 10  # bodies this large are parsed in the helper process (~3 ms of json.loads below)

T = TypeVar("T")


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request's body, at most `limit` bytes: a RequestError (413) as soon as it is longer."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(f"{declared} bytes", limit)
    body = bytearray()
    try:
        async for piece in request.stream():
            if len(body) + len(piece) > limit:
                raise _too_large(f"more than {limit} bytes", limit)
            body += piece
    except ClientDisconnect:
        raise RequestError(400, "the client went away while sending its body") from None
    return bytes(body)


def decode_json(raw: bytes) -> object:
    """The body's JSON value, or a RequestError (400)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # also: a number of thousands of digits, deep nesting
        raise RequestError(400, f"the body is not valid JSON: {str(err)[:200]}") from None


def decode_and_check(raw: bytes, check: Callable[[object], T]) -> T:
    """`check` (a protocol.py parser) applied to the body's JSON value."""
    return check(decode_json(raw))


class BodyDecoder:
    """Parses and checks bodies away from the event loop: small ones in a worker thread, large ones
    through a helper process (see the module's docstring). `aclose()` when the app stops."""

    def __init__(self, max_items: int, process_from: int = PROCESS_BODY_BYTES):
        self.max_items, self.process_from = max_items, process_from
        self._worker = ParseWorker()

    async def decode(self, raw: bytes, check: Callable[[object], T]) -> T:
        if len(raw) >= self.process_from:
            try:
                kind, *answer = await self._worker.parse(raw, self.max_items)
            except (OSError, EOFError):  # the helper could not start, or died: this body in a thread
                pass
            else:
                if kind == "invalid":
                    raise RequestError(400, f"the body is not valid JSON: {answer[0]}")
                if kind == "too_many":
                    path, size = answer
                    field = path.replace("[", ".").split(".")[0] or None
                    raise RequestError(400, f"{path} has {size} items, more than any request to this server can "
                                            f"use ({self.max_items})", None if path == "the body" else field)
                return await asyncio.to_thread(check, answer[0])
        return await asyncio.to_thread(decode_and_check, raw, check)

    async def aclose(self) -> None:
        await self._worker.aclose()


def _too_large(size: str, limit: int) -> RequestError:
    return RequestError(413, f"the body has {size}, more than this server takes ({limit})")
