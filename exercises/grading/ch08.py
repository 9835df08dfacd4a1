"""Chapter 8's cases: `ch08.pad` (a decode batch padded to its bucket), `ch08.fill` (the static
buffers refilled in place) and `ch08.buckets` (the buckets worth recording under a memory budget)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import torch

from exercises.grading.core import call, exercise, expect, expect_raises
from minillm.graphs.buckets import bucket_for
from minillm.graphs.padding import DecodeRow, pad_decode_batch

pad = exercise("ch08.pad", "ch08_pad_batch", "pad_to_bucket")
fill = exercise("ch08.fill", "ch08_fill_buffers", "fill_buffers")
buckets = exercise("ch08.buckets", "ch08_choose_buckets", "choose_buckets")
NAMES = ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens")


def _expected(rows, buckets, width, block_size, pad_block) -> dict | None:
    bucket = bucket_for(len(rows), buckets) if rows else buckets[0]
    if bucket is None:
        return None
    batch = pad_decode_batch([DecodeRow(*r) for r in rows], bucket, width, block_size, pad_block)
    return {name: getattr(batch, name) for name in NAMES}


def _copy(rows):
    return [(t, p, list(b)) for t, p, b in rows]


def _pad(impl: Any, rows, buckets, width: int, block_size: int, pad_block: int, why: str,
         only: tuple[str, ...] = NAMES) -> None:
    """Grade one call on its output only: the learner's code gets its own copy of `rows`, so a change to
    them is reported once, by its own rule (`rows_are_left_unchanged`), and every other rule its own."""
    given = f"pad_to_bucket({rows}, buckets={buckets}, width={width}, block_size={block_size}, pad_block={pad_block})"
    want = _expected(rows, buckets, width, block_size, pad_block)
    got = call(given, f"{want} ({why})", impl, _copy(rows), list(buckets), width, block_size, pad_block)
    if want is None:
        expect(got is None, given, f"None ({why})", repr(got))
        return
    expect(isinstance(got, dict), given, f"a dict of lists ({why})", repr(got))
    for name in only:
        value = got.get(name)
        value = [list(v) for v in value] if name == "block_tables" and isinstance(value, list | tuple) else value
        value = list(value) if isinstance(value, tuple) else value
        expect(value == want[name], given, f'"{name}" {want[name]} ({why})', repr(got.get(name)))


@pad.case
def the_smallest_bucket_that_holds_the_rows(impl: Callable) -> None:
    """The batch pads up to the smallest bucket that holds it"""
    rows = [(7, 5, [3, 0]), (8, 1, [4]), (9, 6, [1, 2])]
    _pad(impl, rows, [1, 2, 4, 8], 3, 4, 9, "3 rows: bucket 4", only=("input_ids", "positions"))
    _pad(impl, rows[:2], [1, 2, 4, 8], 3, 4, 9, "2 rows: bucket 2, no padding", only=("input_ids",))
    _pad(impl, rows, [2, 3, 16], 3, 4, 9, "3 rows: bucket 3 exactly", only=("input_ids", "positions"))


@pad.case
def none_above_the_largest_bucket(impl: Callable) -> None:
    """None when the largest bucket is too small (the step runs eagerly)"""
    _pad(impl, [(1, 0, [0])] * 5, [1, 2, 4], 2, 4, 9, "5 rows, largest bucket 4")


@pad.case
def slots_come_from_the_block_table(impl: Callable) -> None:
    """A row's slot is table[position // block_size] * block_size + position % block_size"""
    _pad(impl, [(7, 5, [3, 0]), (8, 9, [4, 6, 2]), (9, 0, [5])], [3], 3, 4, 7,
         "position 5: table[5 // 4] = block 0, offset 1 -> slot 1", only=("slot_mapping",))


@pad.case
def a_rows_context_counts_its_own_token(impl: Callable) -> None:
    """A row's context length is position + 1: the tokens before it and its own"""
    _pad(impl, [(7, 5, [3, 0]), (8, 9, [4, 6, 2]), (9, 0, [5])], [3], 3, 4, 7,
         "position 5 attends to positions 0..5: 6 tokens", only=("context_lens",))


@pad.case
def padding_rows_touch_only_the_pad_block(impl: Callable) -> None:
    """Padding rows read and write only the pad block: slot pad_block * block_size, table of pad_block, context 1"""
    _pad(impl, [(7, 5, [3, 0])], [4, 8], 3, 4, 9, "1 row + 3 padding rows")
    _pad(impl, [], [2, 4], 2, 8, 0, "no rows at all: the smallest bucket, all padding (pad block 0)")


@pad.case
def block_tables_are_padded_to_the_width(impl: Callable) -> None:
    """Every block table is padded with pad_block up to `width` entries"""
    _pad(impl, [(7, 5, [3, 0]), (8, 1, [4])], [2], 4, 4, 9, "width 4", only=("block_tables",))


@pad.case
def rows_are_left_unchanged(impl: Callable) -> None:
    """The caller's rows are left unchanged: pad copies of the block tables, never the tables themselves"""
    for rows, buckets, why in (([(7, 5, [3, 0]), (8, 1, [4])], [2, 4], "two rows, tables shorter than width 3"),
                               ([(7, 5, [3, 0])], [4], "one row padded up to bucket 4")):
        given = f"pad_to_bucket({rows}, buckets={buckets}, width=3, block_size=4, pad_block=9)"
        mine = _copy(rows)
        call(given, "a padded batch, the rows as they were", impl, mine, list(buckets), 3, 4, 9)
        expect(mine == rows, given, f"rows left as they were, {rows} ({why}): the caller still uses them", repr(mine))


@pad.case
def random_batches_match_the_engine(impl: Callable) -> None:
    """Random batches, buckets and block sizes: every list as the engine's padding gives it"""
    rng = random.Random(8)
    for _ in range(25):
        block_size, width = rng.choice([1, 4, 16]), rng.randint(1, 5)
        buckets = sorted(rng.sample(range(1, 12), rng.randint(1, 4)))
        pad_block = 100
        rows = []
        for _ in range(rng.randint(1, 12)):
            position = rng.randrange(width * block_size)
            table = rng.sample(range(60), position // block_size + 1)
            rows.append((rng.randrange(256), position, table))
        _pad(impl, rows, buckets, width, block_size, pad_block, "as the engine pads it")


# ----------------------------------------------------------------------------------------------------- fill


def _buffers(rows: int, width: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(rows, dtype=torch.long), "positions": torch.zeros(rows, dtype=torch.long),
            "slot_mapping": torch.zeros(rows, dtype=torch.long), "block_tables": torch.zeros(rows, width,
                                                                                             dtype=torch.int32),
            "context_lens": torch.ones(rows, dtype=torch.int32)}


def _batch(rows: int, width: int, seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    return {"input_ids": [rng.randrange(256) for _ in range(rows)],
            "positions": [rng.randrange(64) for _ in range(rows)],
            "slot_mapping": [rng.randrange(512) for _ in range(rows)],
            "block_tables": [[rng.randrange(32) for _ in range(width)] for _ in range(rows)],
            "context_lens": [rng.randrange(1, 65) for _ in range(rows)]}


@fill.case
def every_buffer_holds_its_lists_values(impl: Callable) -> None:
    """Every buffer holds its list's values afterwards"""
    buffers, batch = _buffers(4, 3), _batch(4, 3, seed=1)
    call("fill_buffers(buffers of 4 rows x 3 blocks, a batch of 4 rows)", "no error", impl, buffers, batch)
    for name in NAMES:
        expect(buffers[name].tolist() == batch[name], f"buffers[{name!r}] after fill_buffers", batch[name],
               buffers[name].tolist())


@fill.case
def the_buffers_stay_the_same_tensors_at_the_same_addresses(impl: Callable) -> None:
    """The buffers stay the same tensors, at the same addresses, with their dtypes and shapes: a replay reads those"""
    buffers = _buffers(4, 3)
    before = {name: (t, t.data_ptr(), t.dtype, tuple(t.shape)) for name, t in buffers.items()}
    for seed in (2, 3):  # twice: the second step must land in the same memory too
        call(f"fill_buffers(buffers, batch {seed})", "no error", impl, buffers, _batch(4, 3, seed))
        for name, (tensor, address, dtype, shape) in before.items():
            now = buffers[name]
            expect(now is tensor and now.data_ptr() == address, f"buffers[{name!r}] after step {seed - 1}",
                   "the same tensor at the same address (a CUDA Graph reads that address)",
                   "a new tensor" if now is not tensor else f"data moved to {now.data_ptr():#x}")
            expect(now.dtype == dtype and tuple(now.shape) == shape, f"buffers[{name!r}]", f"{dtype}, {shape}",
                   f"{now.dtype}, {tuple(now.shape)}")


@fill.case
def a_batch_of_another_shape_is_refused_and_changes_nothing(impl: Callable) -> None:
    """A batch whose shape differs from the buffers' raises ValueError and changes nothing (never broadcast)"""
    for rows, width, what in ((1, 3, "1 row for buffers of 4"), (4, 2, "tables 2 wide for buffers 3 wide"),
                              (8, 3, "8 rows for buffers of 4")):
        buffers = _buffers(4, 3)
        batch = _batch(rows, width, seed=4)
        if rows == 4:  # only the tables are wrong; the other lists fit
            batch = _batch(4, 3, seed=4) | {"block_tables": batch["block_tables"]}
        snapshot = {name: t.clone() for name, t in buffers.items()}
        expect_raises(ValueError, f"fill_buffers(buffers of 4 rows x 3 blocks, a batch of {what})", impl, buffers,
                      batch)
        changed = [name for name in NAMES if not torch.equal(buffers[name], snapshot[name])]
        expect(not changed, f"after the refused batch of {what}", "every buffer unchanged", f"{changed} changed")


# ----------------------------------------------------------------------------------------------------- buckets


class Server:
    """One `choose_buckets` question: what a server saw, what each bucket would keep, and its step times
    (a replayed step of bucket b: graph0 + row * b ms; an eager step of n requests: eager0 + row * n ms)."""

    def __init__(self, seen: dict[int, int], capture_mib: dict[int, float], budget_mib: float,
                 graph0: float = 1.0, eager0: float = 3.0, row: float = 0.02, graph_ms: dict[int, float] | None = None):
        self.seen, self.capture_mib, self.budget_mib = seen, capture_mib, budget_mib
        self.graph_ms = dict(graph_ms) if graph_ms is not None else {b: graph0 + row * b for b in capture_mib}
        self.eager_ms = {n: eager0 + row * n for n in range(1, max(seen) + 1)}
        graphs = f"graph_ms={self.graph_ms}" if graph_ms is not None else f"graph_ms[b] = {graph0:g} + {row:g} b"
        self.given = (f"choose_buckets(seen={seen}, capture_mib={capture_mib}, budget_mib={budget_mib:g}, "
                      f"{graphs}, eager_ms[n] = {eager0:g} + {row:g} n)")

    def mean_step_ms(self, chosen: list[int]) -> tuple[float, list[int]]:
        """The mean step time of the steps seen with `chosen` recorded, and the batch sizes that ran eagerly."""
        total, eager = 0.0, []
        for n, steps in self.seen.items():
            bucket = next((b for b in sorted(chosen) if b >= n), None)
            if bucket is None:
                eager.append(n)
            total += steps * (self.eager_ms[n] if bucket is None else self.graph_ms[bucket])
        return total / sum(self.seen.values()), sorted(eager)

    def mib(self, chosen: list[int]) -> float:
        return sum(self.capture_mib[b] for b in chosen)

    def best(self) -> list[int]:
        """Every choice that fits, weighed: the fastest, and among the equally fast the least memory."""
        best, best_key = [], (self.mean_step_ms([])[0], 0.0)
        for size in range(1, len(self.capture_mib) + 1):
            for chosen in itertools.combinations(sorted(self.capture_mib), size):
                if self.mib(list(chosen)) > self.budget_mib + 1e-9:
                    continue
                ms, mib = self.mean_step_ms(list(chosen))[0], self.mib(list(chosen))
                if (ms < best_key[0] and not math.isclose(ms, best_key[0])) or (math.isclose(ms, best_key[0])
                                                                               and mib < best_key[1] - 1e-9):
                    best, best_key = list(chosen), (ms, mib)
        return best

    def describe(self, chosen: list[int]) -> str:
        ms, eager = self.mean_step_ms(chosen)
        ran = f"; steps of {', '.join(map(str, eager))} ran eagerly" if eager else "; no step ran eagerly"
        return f"{chosen} ({self.mib(chosen):g} MiB, a mean step of {ms:.3f} ms{ran})"


def _choose(impl: Any, server: Server, why: str, checks: tuple[str, ...] = ("budget", "fastest", "memory")) -> None:
    """Call the learner's choose_buckets on `server`: a valid list always, then the `checks` named."""
    want = server.best()
    expected = f"{server.describe(want)} ({why})"
    args = (dict(server.seen), dict(server.capture_mib), server.budget_mib, dict(server.graph_ms),
            dict(server.eager_ms))
    got = call(server.given, expected, impl, *args)
    unchanged = args == (server.seen, server.capture_mib, server.budget_mib, server.graph_ms, server.eager_ms)
    expect(unchanged, server.given, "the arguments left unchanged", "an argument modified")
    got = list(got) if isinstance(got, tuple) else got
    valid = (isinstance(got, list) and all(isinstance(b, int) and b in server.capture_mib for b in got)
             and got == sorted(set(got)))
    expect(valid, server.given, f"a sorted list of buckets from capture_mib, each once ({why})", repr(got))
    mib = server.mib(got)
    expect("budget" not in checks or mib <= server.budget_mib + 1e-9, server.given,
           f"buckets whose capture memory fits the budget of {server.budget_mib:g} MiB: {expected}",
           f"{got}: {mib:g} MiB")
    ms, best_ms = server.mean_step_ms(got)[0], server.mean_step_ms(want)[0]
    expect("fastest" not in checks or math.isclose(ms, best_ms) or ms < best_ms, server.given, expected,
           server.describe(got))
    expect("memory" not in checks or mib <= server.mib(want) + 1e-9, server.given,
           f"{server.describe(want)}: as fast, with less memory ({why})", server.describe(got))


@buckets.case
def buckets_are_candidates_sorted_each_once(impl: Callable) -> None:
    """Buckets come from capture_mib, sorted, each once"""
    _choose(impl, Server({1: 10, 2: 10}, {1: 4, 2: 4, 4: 6}, 100), "1 and 2 both fit: every step replays exactly",
            checks=())


@buckets.case
def the_capture_memory_fits_the_budget(impl: Callable) -> None:
    """The chosen buckets' capture memory fits the budget, even when one more bucket would be faster"""
    _choose(impl, Server({1: 400, 2: 300, 4: 200, 8: 100}, {1: 6, 2: 7, 4: 8, 8: 10}, 24),
            "all four would keep 31 MiB; the best three that fit keep 24", checks=("budget",))


@buckets.case
def a_batch_above_the_largest_bucket_runs_eagerly(impl: Callable) -> None:
    """A batch above the largest bucket runs eagerly, at its eager step time: covering it may be worth most"""
    _choose(impl, Server({1: 100, 2: 100, 12: 800}, {1: 10, 2: 12, 4: 16, 8: 24, 16: 40}, 50),
            "most steps have 12 requests: without bucket 16 they run eagerly at 3.24 ms")


@buckets.case
def a_rare_large_batch_may_run_eagerly(impl: Callable) -> None:
    """A rare large batch may run eagerly: a bucket for it is not worth the memory the common sizes need"""
    _choose(impl, Server({1: 500, 2: 300, 4: 150, 32: 5}, {1: 4, 2: 5, 4: 6, 8: 8, 16: 12, 32: 20}, 20),
            "bucket 32 would take the whole budget and pad every step to 32; 5 eager steps cost less")


@buckets.case
def among_equally_fast_choices_the_least_memory(impl: Callable) -> None:
    """Among equally fast choices, the least capture memory: no bucket that no batch uses"""
    _choose(impl, Server({1: 50, 3: 50}, {1: 5, 2: 6, 4: 8, 8: 12}, 100),
            "3 pads to 4 whatever else is recorded: buckets 2 and 8 would serve nothing")


@buckets.case
def with_no_room_for_any_bucket_every_step_runs_eagerly(impl: Callable) -> None:
    """With no room for any bucket, every step runs eagerly: []"""
    _choose(impl, Server({1: 10, 4: 10}, {1: 8, 4: 9}, 6), "the smallest bucket keeps 8 MiB, the budget is 6")


@buckets.case
def every_step_eager_may_be_the_fastest_choice(impl: Callable) -> None:
    """[] may be the fastest choice: when every bucket that fits is slower than an eager step, record none"""
    _choose(impl, Server({1: 100, 2: 100}, {4: 20, 64: 8}, 10, row=0.05),
            "only bucket 64 fits, and padding 1 or 2 requests up to 64 rows (4.20 ms) costs more than an eager "
            "step (3.05 ms, 3.10 ms)")


@buckets.case
def equally_fast_choices_are_told_apart_by_memory(impl: Callable) -> None:
    """Equally fast choices: the one that keeps less memory, whatever its buckets' sizes or their order"""
    for capture in ({4: 10, 8: 4}, {4: 4, 8: 10}):
        _choose(impl, Server({3: 100}, capture, 30, graph_ms={4: 1.0, 8: 1.0}),
                "3 requests run as fast padded to 4 as to 8 (a memory-bound step): the bucket that keeps less "
                "memory")


@buckets.case
def random_servers_get_the_fastest_choice_that_fits(impl: Callable) -> None:
    """Random servers: no choice that fits the budget has a lower mean step time"""
    rng = random.Random(8)
    for _ in range(25):
        sizes = sorted(rng.sample(range(1, 49), rng.randint(2, 6)))
        seen = {n: rng.choice([1, 5, 20, 100, 400]) for n in sizes}
        candidates = sorted({1, 2, 4, *rng.sample(range(8, 65, 8), rng.randint(1, 5))})
        capture = {b: float(4 + b // 2 + rng.randint(0, 3)) for b in candidates}
        budget = float(rng.randint(4, int(sum(capture.values()))))
        server = Server(seen, capture, budget, graph0=rng.choice([0.5, 1.0, 2.0]), eager0=rng.choice([2.5, 4.0, 8.0]),
                        row=rng.choice([0.01, 0.05, 0.2]))
        _choose(impl, server, "the fastest choice that fits")
