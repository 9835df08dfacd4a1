"""The KV connector: how a prompt's K/V travel from the prefill engine to the decode engine.

    prefill core                           router (front end)                  decode core
    ───────────                            ──────────────────                  ───────────
    prefill the prompt (1 token)
    read its full blocks' K/V
    send(tensor, tag) ── posted ──►  KVHandle in its CoreStep ──► AddRequest(kv=handle)
                                                                       recv(tensor, tag)  ◄── the bytes
                                                                       adopt blocks: cached, as if
                                                                       computed here (block_pool.adopt)
                                                                       add the request: a prefix-cache
                                                                       hit; it computes the last few
                                                                       prompt tokens and decodes on

The bytes go core to core through a two-rank torch.distributed group (gloo here, NCCL between
GPUs — the place of NIXL or Mooncake's transfer engine in real deployments); only the small handle
goes through the router. The sender does not wait: its send is posted, the tensor kept until the
transfer completes (`reap`). The receiver turns the blocks into prefix-cache entries, so the engine's
scheduler needs nothing new — the request is admitted like any other, finds its prompt cached, and
(like every prefix hit) computes at least the prompt's last token itself, whose logits give the
first output token. A transfer that fails or arrives for an aborted request costs nothing but
time: the request then computes its prompt itself, or the blocks wait as evictable cache.

Only whole blocks travel: a prompt of 37 tokens in blocks of 16 sends 2 blocks (32 tokens), and
the decode engine computes the other 5.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import torch

from minillm.distributed.communicator import make_group

logger = logging.getLogger("minillm")

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class KVTransfer:
    """Which end of the connector a core is, and where the two meet (the router's TCP store)."""

    role: str  # "prefill" | "decode"
    store_port: int

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a KV transfer role is one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class KVHandle:
    """What the decode core needs to receive one request's K/V: the prefill core's send, described."""

    request_id: str  # the router's (core) id of the request
    tag: int | None  # the send's tag; None: no whole block to send (the prompt is shorter than a block + 1)
    token_ids: tuple[int, ...]  # the tokens of the blocks sent, block after block
    shape: tuple[int, ...]  # (2, num_layers, num_blocks, block_size, num_kv_heads, head_dim)
    dtype: str
    sent_at: float  # time.perf_counter() when the send was posted

    @property
    def num_blocks(self) -> int:
        return self.shape[2] if self.tag is not None else 0

    @property
    def nbytes(self) -> int:
        if self.tag is None:
            return 0
        count = 1
        for n in self.shape:
            count *= n
        return count * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


class KVConnector:
    """One end of the connector, inside an engine core (its engine's cache and block pool)."""

    def __init__(self, transfer: KVTransfer, engine):
        if engine.pool is None or engine.pool.cache is None:
            raise ValueError("a disaggregated engine needs kv='paged' and prefix_cache=True: the K/V arrive as "
                             "cached blocks")
        if engine.config.kv_cache_dtype != "auto" or engine.workers is not None:
            raise ValueError("disaggregation moves K/V in the model's dtype between single-rank engines: "
                             "kv_cache_dtype='auto' and tensor_parallel_size=1")
        self.role, self.engine = transfer.role, engine
        rank = ROLES.index(transfer.role)
        self.group = make_group(rank, 2, "127.0.0.1", transfer.store_port, engine.model.device)
        self._tags = itertools.count()
        self._sending: list[tuple[object, torch.Tensor]] = []  # (the send's work, its tensor): kept until done
        self.spans: list[tuple[str, float, float, str]] = []  # (kind, start, end, label) for a replay

    # ------------------------------------------------------------------ the prefill side
    def send(self, request_id: str, prompt_token_ids: list[int]) -> KVHandle:
        """Post the send of the cached full blocks of a prompt this engine has just prefilled (the request
        has ended; its blocks wait, cached, until the next step could evict them — so: now)."""
        pool, cache = self.engine.pool, self.engine.cache
        blocks = [entry.block_id for entry in pool.find_cached(prompt_token_ids)]
        now = time.perf_counter()
        if not blocks:
            return KVHandle(request_id, None, (), (), str(self.engine.model.dtype).split(".")[-1], now)
        kv = cache.read_blocks(blocks)  # (2, layers, blocks, block_size, kv_heads, head_dim): a copy
        tag = next(self._tags)
        try:
            work = self.group.send([kv], 1, tag)
        except Exception as err:  # the decode core is gone (closed, killed): this core carries on; a decode core
            logger.warning("the K/V of request %s could not be sent (%s)", request_id, err)  # would compute it
            return KVHandle(request_id, None, (), (), str(kv.dtype).split(".")[-1], now)
        self._sending.append((work, kv))
        handle = KVHandle(request_id, tag, tuple(prompt_token_ids[: len(blocks) * pool.block_size]), tuple(kv.shape),
                          str(kv.dtype).split(".")[-1], now)
        self.spans.append(("send KV", now, time.perf_counter(), f"{len(blocks)} blocks"))
        return handle

    def reap(self) -> None:
        """Let go of the tensors whose transfer has completed."""
        if self._sending:
            self._sending = [(work, kv) for work, kv in self._sending if not work.is_completed()]

    # ------------------------------------------------------------------ the decode side
    def receive(self, handle: KVHandle) -> int:
        """Receive a prompt's K/V and make them cached blocks of this engine; returns the tokens adopted (0 if
        nothing arrived: the request computes its prompt itself)."""
        start = time.perf_counter()
        kv = self._recv(handle)
        if kv is None:
            return 0
        pool = self.engine.pool
        writes, held = pool.adopt(handle.token_ids)
        try:
            if writes:
                self.engine.cache.write_blocks([block for _, block in writes],
                                               kv[:, :, [index for index, _ in writes]])
        finally:
            pool.release(held)
        self.spans.append(("receive KV", start, time.perf_counter(), f"{handle.num_blocks} blocks, "
                                                                     f"{handle.nbytes / 1024:.0f} KiB"))
        return len(held) * pool.block_size

    def discard(self, handle: KVHandle) -> None:
        """Receive and drop a transfer nobody wants any more (its request was aborted meanwhile): the sender's
        tensor is freed once its bytes are taken."""
        start = time.perf_counter()
        if self._recv(handle) is not None:
            self.spans.append(("receive KV", start, time.perf_counter(), f"{handle.num_blocks} blocks, dropped"))

    def _recv(self, handle: KVHandle) -> torch.Tensor | None:
        if handle.tag is None:
            return None
        kv = torch.empty(handle.shape, dtype=getattr(torch, handle.dtype), device=self.engine.model.device)
        try:
            self.group.recv([kv], 0, handle.tag).wait()
        except Exception as err:  # the prefill core is gone: this request computes its prompt here
            logger.warning("the K/V of request %s did not arrive (%s): it is computed here", handle.request_id, err)
            return None
        return kv

    def drain_spans(self) -> list[tuple[str, float, float, str]]:
        spans, self.spans = self.spans, []
        return spans
