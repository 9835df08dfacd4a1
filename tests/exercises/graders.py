"""The exercise graders, written once: CI runs them on `solutions/` (all must pass) and on the
untouched `exercises/` stubs (all must fail); notebooks run them through `check()`.

A grader is a list of cases; each case takes the implementation and raises AssertionError with a
message a learner can act on.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable

import torch

Case = Callable[[Callable], None]
GRADERS: dict[str, list[Case]] = {}
EXERCISES: dict[str, tuple[str, str]] = {}  # grader name -> (module in exercises/ and solutions/, function)


def case(name: str, module: str, function: str):
    """Register a grading case under exercise `name`."""
    EXERCISES[name] = (module, function)

    def register(fn: Case) -> Case:
        GRADERS.setdefault(name, []).append(fn)
        return fn

    return register


def run(name: str, impl: Callable) -> list[tuple[str, bool, str]]:
    """(case name, passed, message) for every case of exercise `name`."""
    if name not in GRADERS:
        raise KeyError(f"unknown exercise {name!r}; known: {sorted(GRADERS)}")
    results = []
    for fn in GRADERS[name]:
        try:
            fn(impl)
            results.append((fn.__name__, True, ""))
        except NotImplementedError:
            results.append((fn.__name__, False, "not implemented yet (the stub raises NotImplementedError)"))
        except AssertionError as err:
            results.append((fn.__name__, False, str(err) or "assertion failed"))
        except Exception as err:  # the learner's code crashed: show where
            tb = traceback.extract_tb(err.__traceback__)[-1]
            results.append((fn.__name__, False, f"{type(err).__name__}: {err} (line {tb.lineno} of {tb.filename})"))
    return results


def check(name: str, impl: Callable) -> None:
    """Grade `impl` for exercise `name`, printing PASS/FAIL per case and a summary line."""
    results = run(name, impl)
    for case_name, passed, message in results:
        print(f"{'PASS' if passed else 'FAIL'}  {case_name.replace('_', ' ')}" + ("" if passed else f": {message}"))
    passed = sum(ok for _, ok, _ in results)
    print(f"{name}: {passed}/{len(results)} passed" + (" — well done!" if passed == len(results) else ""))


# ----------------------------------------------------------------------------- ch01.top_p


def _hf_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    from transformers.generation.logits_process import TopPLogitsWarper

    rows = logits if logits.dim() == 2 else logits[None]
    out = TopPLogitsWarper(top_p=p)(None, rows.clone())
    return out if logits.dim() == 2 else out[0]


@case("ch01.top_p", "ch01_top_p", "top_p_filter")
def matches_transformers_on_random_logits(impl):
    for seed, p in enumerate([0.1, 0.5, 0.8, 0.95]):
        logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(seed)) * 2
        got, want = impl(logits.clone(), p), _hf_top_p(logits, p)
        kept_got, kept_want = torch.isfinite(got), torch.isfinite(want)
        assert got.shape == logits.shape, f"shape {tuple(got.shape)}, expected {tuple(logits.shape)}"
        assert torch.equal(kept_got, kept_want), (
            f"top_p={p}: you keep {int(kept_got.sum())} tokens, transformers keeps {int(kept_want.sum())}")
        assert torch.equal(got[kept_got], logits[kept_got]), "kept logits must be unchanged"


@case("ch01.top_p", "ch01_top_p", "top_p_filter")
def keeps_the_token_that_crosses_the_boundary(impl):
    logits = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))
    kept = torch.isfinite(impl(logits, 0.6)).tolist()
    assert kept == [False, True, False, True], (
        f"probabilities 0.05/0.5/0.15/0.3, top_p=0.6: expected to keep 0.5 and 0.3, kept mask {kept}")


@case("ch01.top_p", "ch01_top_p", "top_p_filter")
def always_keeps_the_most_likely_token(impl):
    logits = torch.tensor([0.0, 5.0, 1.0])
    kept = torch.isfinite(impl(logits, 0.01)).tolist()
    assert kept == [False, True, False], f"tiny top_p must keep exactly the top token, kept mask {kept}"


@case("ch01.top_p", "ch01_top_p", "top_p_filter")
def top_p_one_keeps_everything(impl):
    logits = torch.randn(50, generator=torch.Generator().manual_seed(9))
    assert torch.equal(impl(logits, 1.0), logits), "top_p=1.0 must return the logits unchanged"


# ----------------------------------------------------------------------------- ch01.kv_decode


class _RecordingModel:
    """Wraps a CausalLM and records how many tokens each forward pass was fed."""

    def __init__(self, model):
        self._model, self.fed = model, []

    def __call__(self, input_ids, positions, backend):
        self.fed.append(int(input_ids.shape[0]))
        return self._model(input_ids, positions, backend)

    forward = __call__

    def __getattr__(self, name):
        return getattr(self._model, name)


@functools.cache
def _tiny_qwen3():
    from minillm.model import CausalLM, ModelConfig

    config = ModelConfig(family="qwen3", vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=256, qk_norm=True)
    torch.manual_seed(0)
    model = CausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


def _reference(model, prompt, n):
    from minillm.generate import generate_without_cache
    from minillm.sampling import SamplingParams

    class _Ids:  # the loop needs a tokenizer only to detokenise; ids are enough here
        def decode(self, ids, **_):
            return ""

    params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
    return generate_without_cache(model, _Ids(), prompt, params).token_ids


@case("ch01.kv_decode", "ch01_kv_decode", "greedy_decode_with_cache")
def equals_the_naive_loop_on_a_random_model(impl):
    model = _tiny_qwen3()
    prompt = [5, 17, 99, 3, 250, 41, 7]
    got, want = list(impl(model, prompt, 20)), _reference(model, prompt, 20)
    assert len(got) == len(want), f"expected {len(want)} tokens, got {len(got)}"
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None, f"first difference at new token {first}: got {got}, want {want}"


@case("ch01.kv_decode", "ch01_kv_decode", "greedy_decode_with_cache")
def answers_one_plus_one_with_the_shipped_model(impl):
    from minillm.model import load

    model, tokenizer = load("target", device="cpu")
    ids = tokenizer.encode("What is 1+1? Answer:")
    got = impl(model, ids, 3)
    assert tokenizer.decode(got).strip().startswith("2"), f"decoded {tokenizer.decode(got)!r}"


@case("ch01.kv_decode", "ch01_kv_decode", "greedy_decode_with_cache")
def prefills_once_then_feeds_one_token_per_step(impl):
    model = _RecordingModel(_tiny_qwen3())
    impl(model, [1, 2, 3, 4, 5], 6)
    assert model.fed == [5, 1, 1, 1, 1, 1], (
        f"tokens fed per pass were {model.fed}; expected [5, 1, 1, 1, 1, 1] (prefill, then one per step)")


# ----------------------------------------------------------------------------- ch02.slot_utilisation


@case("ch02.slot_utilisation", "ch02_slot_utilisation", "slot_utilisation")
def counts_busy_slot_steps(impl):
    got = impl([[12, 5, 0, 1], [1, 1, 0, 1], [0, 1, 0, 0]], 4)
    assert abs(got - 7 / 12) < 1e-9, f"3 steps × 4 slots with 7 busy slot-steps: expected 7/12, got {got}"


@case("ch02.slot_utilisation", "ch02_slot_utilisation", "slot_utilisation")
def short_lists_mean_idle_slots_and_no_steps_is_zero(impl):
    got = impl([[3], [1, 1]], 4)
    assert abs(got - 3 / 8) < 1e-9, f"expected 3/8 = 0.375 (missing slots ran nothing), got {got}"
    assert impl([], 4) == 0.0, "no steps: utilisation 0.0"


@case("ch02.slot_utilisation", "ch02_slot_utilisation", "slot_utilisation")
def agrees_with_the_engine_trace(impl):
    from minillm.trace import Trace

    trace = _static_trace()
    steps = [[s.num_tokens if s is not None else 0 for s in step.slots] for step in trace.steps]
    got = impl(steps, trace.num_slots)
    assert abs(got - trace.slot_utilisation) < 1e-9, f"engine says {trace.slot_utilisation:.4f}, you say {got}"
    assert isinstance(trace, Trace)


@functools.cache
def _static_trace():
    from minillm.config import EngineConfig
    from minillm.engine import LLMEngine
    from minillm.sampling import SamplingParams

    class _Ids:
        def encode(self, text):
            return list(text.encode())

        def decode(self, ids, **_):
            return ""

    engine = LLMEngine(_tiny_qwen3(), _Ids(), EngineConfig(batching="static", max_num_seqs=3, max_model_len=64))
    for prompt, n in [([5, 6, 7], 4), ([8, 9], 12), ([10, 11, 12, 13], 7), ([14], 3)]:
        engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return engine.trace


# ----------------------------------------------------------------------------- ch03.schedule_step


@case("ch03.schedule_step", "ch03_schedule_step", "plan_step")
def decodes_running_requests_then_admits_newcomers(impl):
    runs, admitted = impl([("a", 1), ("b", 1)], [("c", 10), ("d", 20)], free_slots=2, max_tokens_per_step=100)
    assert list(runs) == [("a", 1), ("b", 1), ("c", 10), ("d", 20)], f"runs {runs}"
    assert list(admitted) == ["c", "d"], f"admitted {admitted}"


@case("ch03.schedule_step", "ch03_schedule_step", "plan_step")
def respects_free_slots_and_the_token_budget(impl):
    runs, admitted = impl([("a", 1)], [("c", 10), ("d", 20)], free_slots=1, max_tokens_per_step=100)
    assert list(admitted) == ["c"], f"one free slot: only c may enter, admitted {admitted}"
    runs, admitted = impl([("a", 1)], [("c", 10), ("d", 20)], free_slots=5, max_tokens_per_step=25)
    assert list(admitted) == ["c"] and list(runs) == [("a", 1), ("c", 10)], (
        f"budget 25: a (1) and c (10) fit, d (20) does not; got runs {runs}, admitted {admitted}")


@case("ch03.schedule_step", "ch03_schedule_step", "plan_step")
def nobody_overtakes_a_waiting_request_that_does_not_fit(impl):
    runs, admitted = impl([], [("big", 50), ("small", 5)], free_slots=4, max_tokens_per_step=30)
    assert list(admitted) == [] and list(runs) == [], (
        f"'big' does not fit and 'small' must not overtake it; got runs {runs}, admitted {admitted}")


@case("ch03.schedule_step", "ch03_schedule_step", "plan_step")
def matches_the_engine_scheduler_on_random_queues(impl):
    import random

    from minillm.request import Request
    from minillm.sampling import SamplingParams
    from minillm.scheduler import ContinuousScheduler

    rng = random.Random(7)
    for trial in range(50):
        slots, budget = rng.randint(1, 6), rng.randint(1, 60)
        scheduler = ContinuousScheduler(slots, 512, budget)
        for i in range(rng.randint(0, slots)):  # running requests: decoding or mid-prompt
            r = Request(f"r{i}", [1] * rng.randint(1, 40), SamplingParams(), 0.0)
            scheduler.add(r)
            scheduler.waiting.remove(r)
            scheduler._admit(r)
            r.num_computed_tokens = r.num_tokens - rng.choice([1, 1, 1, rng.randint(1, r.num_tokens)])
        for i in range(rng.randint(0, 5)):
            scheduler.add(Request(f"w{i}", [1] * rng.randint(1, 40), SamplingParams(), 0.0))
        running = [(r.request_id, r.num_uncomputed_tokens) for r in scheduler.running]
        waiting = [(r.request_id, r.num_uncomputed_tokens) for r in scheduler.waiting]
        free = len(scheduler.free_slots)
        out = scheduler.schedule()
        want_runs = [(c.request_id, c.num_tokens) for c in out.chunks]
        want_admitted = [r.request_id for r in out.new_requests]
        runs, admitted = impl(running, waiting, free, budget)
        assert (list(runs), list(admitted)) == (want_runs, want_admitted), (
            f"trial {trial}: running {running}, waiting {waiting}, {free} free slots, budget {budget}: "
            f"engine runs {want_runs} admits {want_admitted}; you run {list(runs)} admit {list(admitted)}")


# ----------------------------------------------------------------------------- ch04.allocate
@case("ch04.allocate", "ch04_block_allocator", "BlockAllocator")
def allocates_from_the_front_with_ref_count_one(cls):
    pool = cls(num_blocks=5, block_size=4)
    assert pool.allocate(2) == [0, 1], "allocate(2) on a fresh pool should return blocks [0, 1]"
    assert pool.allocate(1) == [2]
    assert pool.ref_counts == [1, 1, 1, 0, 0], f"ref counts should be [1, 1, 1, 0, 0], got {pool.ref_counts}"
    assert list(pool.free_queue) == [3, 4]


@case("ch04.allocate", "ch04_block_allocator", "BlockAllocator")
def running_out_raises_and_takes_nothing(cls):
    pool = cls(num_blocks=3, block_size=4)
    pool.allocate(2)
    try:
        pool.allocate(2)
    except MemoryError:
        pass
    else:
        raise AssertionError("allocate(2) with 1 free block should raise MemoryError")
    assert list(pool.free_queue) == [2] and pool.ref_counts == [1, 1, 0], "a failed allocate must take no block"


@case("ch04.allocate", "ch04_block_allocator", "BlockAllocator")
def append_grows_a_table_only_at_block_boundaries(cls):
    pool = cls(num_blocks=6, block_size=4)
    table = pool.allocate(1)  # holds tokens 0-3
    assert pool.append(table, 4) == [], "4 tokens still fit one block of 4"
    assert pool.append(table, 5) == [1] and table == [0, 1], "the 5th token needs a second block"
    assert pool.append(table, 12) == [2] and table == [0, 1, 2]
    assert pool.append(table, 7) == [] and table == [0, 1, 2], "append never shrinks a table"


@case("ch04.allocate", "ch04_block_allocator", "BlockAllocator")
def shared_blocks_return_when_the_last_holder_frees(cls):
    pool = cls(num_blocks=4, block_size=4)
    a = pool.allocate(2)
    pool.incref([a[0]])  # a second request shares block 0
    pool.free(a)
    assert pool.ref_counts[:2] == [1, 0], f"after freeing [0, 1] once, counts should be [1, 0]: {pool.ref_counts}"
    assert list(pool.free_queue) == [2, 3, 1], "block 1 goes to the BACK of the free queue; block 0 is still held"
    pool.free([0])
    assert list(pool.free_queue) == [2, 3, 1, 0]
    try:
        pool.free([0])
    except ValueError:
        pass
    else:
        raise AssertionError("freeing a free block (double free) should raise ValueError")


# ----------------------------------------------------------------------------- ch04.slot_mapping
@case("ch04.slot_mapping", "ch04_slot_mapping", "slot_mapping")
def maps_positions_through_the_table(fn):
    got = fn([7, 2, 9], 4, 0, 10)
    assert got == [28, 29, 30, 31, 8, 9, 10, 11, 36, 37], f"table [7, 2, 9], block 4, tokens 0-9: got {got}"


@case("ch04.slot_mapping", "ch04_slot_mapping", "slot_mapping")
def a_window_in_the_middle(fn):
    assert fn([3, 0], 16, 15, 17) == [63, 0], "tokens 15 and 16 straddle blocks 3 and 0"
    assert fn([5], 8, 4, 4) == [], "an empty range maps to no slots"


@case("ch04.slot_mapping", "ch04_slot_mapping", "slot_mapping")
def agrees_with_the_engine_block_pool(fn):
    from minillm.kv.block_pool import BlockPool

    pool = BlockPool(num_blocks=12, block_size=8)
    pool.take(3)
    pool.allocate("x", 30)
    for start, end in [(0, 30), (7, 9), (16, 24)]:
        assert fn(pool.block_table("x"), 8, start, end) == pool.slot_mapping("x", start, end)


@case("ch04.slot_mapping", "ch04_slot_mapping", "slot_mapping")
def positions_past_the_table_raise(fn):
    try:
        fn([1, 2], 4, 6, 9)
    except ValueError:
        return
    raise AssertionError("positions 6-8 need a third block of 4: slot_mapping should raise ValueError")
