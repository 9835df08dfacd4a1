"""What the engine really did, step by step: plain, serialisable records for widgets and tests.

    step 7:  slot 0 [A decode 1] | slot 1 [B prefill 12] | slot 2 [idle] | slot 3 [C decode 1]
             admitted: B    finished: A    preempted: -    12.4 ms
             KV after the step: A 40 tokens, B 12, C 9 (paged: A in blocks [3, 0, 5], ...)
             prefix cache: B found 8 tokens cached; events: hit 3, alloc 6, cache 6 ...
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SlotState:
    request_id: str
    num_tokens: int  # tokens this request ran in the step (0: it holds the slot but did not run)
    phase: str  # "prefill" | "decode" | "idle"
    sampled: bool = True  # the step gave it a new token (not: idle, or a prefill chunk that ends mid-prompt)


@dataclass(frozen=True)
class StepRecord:
    step: int
    start_time: float  # seconds since the engine started
    duration: float  # seconds the step took
    slots: tuple[SlotState | None, ...]  # one entry per slot; None = free
    admitted: tuple[str, ...]
    finished: tuple[str, ...]
    preempted: tuple[str, ...] = ()
    kv_tokens: dict[str, int] = field(default_factory=dict)  # tokens in the KV cache per request, after the step
    blocks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # paged cache: each request's block table
    cache_hits: dict[str, int] = field(default_factory=dict)  # prefix cache: tokens admitted requests found cached
    kv_events: tuple[tuple, ...] = ()  # prefix cache: the block pool's events, in order (BlockPool.drain_events)
    speculation: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    #   speculative decoding: per verified request, (the proposer's guesses, the tokens kept: accepted guesses
    #   and the target's own last one)
    recorded_batch: int | None = None  # chapter 8: the bucket whose recorded step (graph / compiled) ran it

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.slots if s is not None)

    @property
    def decode_tokens(self) -> int:
        """Tokens of requests decoding in this step (one each)."""
        return sum(s.num_tokens for s in self.slots if s is not None and s.phase == "decode")

    @property
    def prefill_tokens(self) -> dict[str, int]:
        """Prompt tokens each prefilling request ran in this step: its whole prompt, or one chunk (chapter 6)."""
        return {s.request_id: s.num_tokens for s in self.slots if s is not None and s.phase == "prefill"}

    @property
    def busy_slots(self) -> int:
        return sum(1 for s in self.slots if s is not None and s.num_tokens > 0)


@dataclass
class Trace:
    """The engine's recent steps, oldest first. A long-lived engine (a server) would otherwise grow
    its trace forever, so only the newest `max_steps` records are kept, and no more of them than fit in
    about `max_bytes` (`approx_bytes`: 64 requests with 2k-token block tables take ~70 KB a step); None
    lifts a bound. `num_dropped` counts the older ones let go, and `StepRecord.step` keeps counting."""

    num_slots: int
    steps: list[StepRecord] = field(default_factory=list)
    max_model_len: int | None = None  # what a contiguous slot reserves per request
    block_size: int | None = None  # paged cache only
    num_blocks: int | None = None  # paged cache only
    max_steps: int | None = None
    num_dropped: int = 0
    max_bytes: int | None = None
    num_bytes: int = field(default=0, init=False)  # approx_bytes of the kept steps
    _sizes: list[int] = field(default_factory=list, init=False, repr=False)  # each kept step's, in order

    @property
    def next_step(self) -> int:
        """The number the next recorded step gets."""
        return self.num_dropped + len(self.steps)

    def __post_init__(self) -> None:
        self._sizes = [approx_bytes(s) for s in self.steps]
        self.num_bytes = sum(self._sizes)

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)
        self._sizes.append(approx_bytes(step))
        self.num_bytes += self._sizes[-1]
        drop = 0  # the oldest go while either bound is passed (the newest step always stays)
        while drop < len(self.steps) - 1 and (
                (self.max_steps is not None and len(self.steps) - drop > self.max_steps)
                or (self.max_bytes is not None and self.num_bytes > self.max_bytes)):
            self.num_bytes -= self._sizes[drop]
            drop += 1
        if drop:
            del self.steps[:drop], self._sizes[:drop]
            self.num_dropped += drop

    @property
    def slot_utilisation(self) -> float:
        """Busy slot-steps / all slot-steps of the kept steps: 1.0 means no slot was ever idle."""
        if not self.steps:
            return 0.0
        return sum(s.busy_slots for s in self.steps) / (len(self.steps) * self.num_slots)

    def to_dict(self) -> dict:
        return {"num_slots": self.num_slots, "steps": [asdict(s) for s in self.steps],
                "max_model_len": self.max_model_len, "block_size": self.block_size, "num_blocks": self.num_blocks,
                "max_steps": self.max_steps, "num_dropped": self.num_dropped, "max_bytes": self.max_bytes}

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        steps = [StepRecord(s["step"], s["start_time"], s["duration"],
                            tuple(None if x is None else SlotState(**x) for x in s["slots"]),
                            tuple(s["admitted"]), tuple(s["finished"]), tuple(s.get("preempted", ())),
                            dict(s.get("kv_tokens", {})), {k: tuple(v) for k, v in s.get("blocks", {}).items()},
                            dict(s.get("cache_hits", {})),
                            tuple(tuple(tuple(x) if isinstance(x, list) else x for x in e)
                                  for e in s.get("kv_events", ())),
                            {k: (tuple(v[0]), tuple(v[1])) for k, v in s.get("speculation", {}).items()})
                 for s in data["steps"]]
        return cls(data["num_slots"], steps, data.get("max_model_len"), data.get("block_size"), data.get("num_blocks"),
                   data.get("max_steps"), data.get("num_dropped", 0), data.get("max_bytes"))


def approx_bytes(step: StepRecord) -> int:
    """Roughly what a record holds in memory: ~8 bytes per id in its tuples (a pointer; small ints are
    shared) and ~150 per entry of its slots, dicts and id lists (the entry, its string, its object)."""
    ids = (sum(len(table) for table in step.blocks.values()) + sum(len(e) for e in step.kv_events)
           + sum(len(g) + len(k) for g, k in step.speculation.values()))
    entries = (len(step.slots) + len(step.kv_tokens) + len(step.blocks) + len(step.cache_hits) + len(step.admitted)
               + len(step.finished) + len(step.preempted) + len(step.speculation) + len(step.kv_events))
    return 300 + 8 * ids + 150 * entries
