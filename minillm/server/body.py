"""Request bodies: read with a bound, parsed off the event loop (chapter 9).

    bytes arrive ─► counted as they arrive: past MAX_BODY_BYTES ─► 413 at once (the rest is never read)
                 ─► json.loads in a worker thread ─► protocol.py's checks (the same thread)

The bound holds whatever the transfer encoding: a declared Content-Length over it is refused before
a byte is read, and a chunked body (no length) is read piece by piece and refused as soon as it
passes it, so a client streaming a gigabyte costs the server a few megabytes at most.

Parsing runs in a worker thread, but json.loads is one C call that keeps Python's interpreter lock:
a body of a million numbers would hold every other thread — the event loop included — for tens of
milliseconds. A large body's integers are therefore built by a small Python function, which lets
the interpreter switch threads between them (every few milliseconds), so no client's stream stalls.
"""

from __future__ import annotations

import json

from starlette.requests import ClientDisconnect, Request

from minillm.server.protocol import RequestError

MAX_BODY_BYTES = 4 << 20  # 4 MiB: far more than any prompt the context can hold, far less than a flood
YIELDING_PARSE_BYTES = 64 << 10  # bodies above this parse their integers in Python (see the docstring)


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
    """The body's JSON value, or a RequestError (400). Call it in a worker thread."""
    try:
        if len(raw) > YIELDING_PARSE_BYTES:
            return json.loads(raw, parse_int=_int)
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # also: a number of thousands of digits, deep nesting
        raise RequestError(400, f"the body is not valid JSON: {str(err)[:200]}") from None


def _int(text: str) -> int:
    """json.loads' integers, built in Python code so the interpreter may switch threads between them."""
    return int(text)


def _too_large(size: str, limit: int) -> RequestError:
    return RequestError(413, f"the body has {size}, more than this server takes ({limit})")
