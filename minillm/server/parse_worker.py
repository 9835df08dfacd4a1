"""The helper process that parses large request bodies, so their parse holds no lock the engine needs.

    server (event loop)                            helper: python -I parse_worker.py (standard library only)
      pickle (raw body, limit) ── stdin ──►          json.loads, then every list and object measured
      await the answer         ◄── stdout ──         ("ok", the value) | ("invalid", why) | ("too_many", path, n)

Why (body.py says more): json.loads keeps Python's interpreter lock for its whole call, ~50 ms for
a million token ids, and every thread busy with Python makes the engine's step thread wait for the
lock after each tensor operation. A separate process shares no such lock. What comes back must be
cheap to unpickle too (a million ids take ~20 ms), so a value holding a list or object of more than
`limit` items — more than any request to this server can use — comes back as its path and size
only, and the server refuses it by name.

The helper imports nothing from minillm (it starts in a few tens of milliseconds), serves one body
at a time, in order, and starts on first use. One that dies, or is interrupted half-way through an
answer, is killed and started again on next use.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import sys

_LENGTH = 8  # bytes of the little-endian length before each message


class ParseWorker:
    """The server's handle on the helper process: `await parse(raw, limit)`."""

    def __init__(self):
        self._process: asyncio.subprocess.Process | None = None
        self._lock: asyncio.Lock | None = None

    async def parse(self, raw: bytes, limit: int) -> tuple:
        """The helper's answer for `raw` (see the module's docstring). Raises OSError or EOFError if
        the helper cannot start or dies."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:  # one exchange at a time on the pipe
            if self._process is None or self._process.returncode is not None:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable, "-I", __file__, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            process = self._process
            try:
                payload = pickle.dumps((raw, limit), protocol=pickle.HIGHEST_PROTOCOL)
                process.stdin.write(len(payload).to_bytes(_LENGTH, "little") + payload)
                await process.stdin.drain()
                size = int.from_bytes(await process.stdout.readexactly(_LENGTH), "little")
                return pickle.loads(await process.stdout.readexactly(size))
            except BaseException:  # it died, or this exchange was cancelled half-way: the pipe is out of step
                self._process = None
                if process.returncode is None:
                    process.kill()
                raise

    async def aclose(self) -> None:
        """Stop the helper and wait until it is gone."""
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                process.kill()
            process.stdin.close()
            await process.wait()


def answer(raw: bytes, limit: int) -> tuple:
    """What the helper sends back for one body."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as err:  # also: a number of thousands of digits, deep nesting
        return "invalid", str(err)[:200]
    crowded = largest_container(value, limit) if isinstance(value, dict | list) else None
    return ("ok", value) if crowded is None else ("too_many", *crowded)


def largest_container(value: object, limit: int) -> tuple[str, int] | None:
    """(path, size) of the first list or object in `value` holding more than `limit` items, or None."""
    todo = [(value, "")]
    while todo:
        node, path = todo.pop()
        if len(node) > limit:
            return path or "the body", len(node)
        pairs = node.items() if isinstance(node, dict) else enumerate(node)
        todo += [(child, _path(path, key)) for key, child in pairs if isinstance(child, dict | list)]
    return None


def _path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def serve(stdin, stdout) -> None:
    """The helper's loop: read a body, answer it, until the server closes the pipe."""
    while header := stdin.read(_LENGTH):
        raw, limit = pickle.loads(stdin.read(int.from_bytes(header, "little")))
        payload = pickle.dumps(answer(raw, limit), protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(len(payload).to_bytes(_LENGTH, "little") + payload)
        stdout.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
