"""Plausible wrong answers, each a small variant of the solution with one learner mistake (marked
WRONG). The graders must reject every one with a FAIL line containing `rule`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

from minillm.attention import ContiguousKVCache
from solutions.ch04_block_allocator import BlockAllocator
from solutions.ch05_copy_on_write import ForkingAllocator
from solutions.ch05_evicting_allocator import EvictingAllocator
from solutions.ch10_output_processor import OutputProcessor

WRONG: list[tuple[str, Any, str]] = []  # (exercise, wrong implementation, substring of a FAIL line)


def wrong(name: str, rule: str) -> Callable[[Any], Any]:
    def register(impl: Any) -> Any:
        WRONG.append((name, impl, rule))
        return impl

    return register


# ----------------------------------------------------------------------------- ch01.top_p


def _mask(logits: torch.Tensor, drop: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))


@wrong("ch01.top_p", "keeps the token that crosses the boundary")
def top_p_drops_the_crossing_token(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
    drop = probs.cumsum(dim=-1) > top_p  # WRONG: the token whose probability crosses top_p goes too
    drop[..., 0] = False
    return _mask(logits, drop, order)


@wrong("ch01.top_p", "sum to at most 1 - top_p")
def top_p_strictly_less(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1)
    drop = probs.cumsum(dim=-1) < 1 - top_p  # WRONG: "at most" is <=
    drop[..., -1] = False
    return _mask(logits, drop, order)


@wrong("ch01.top_p", "always keeps the most likely token")
def top_p_may_drop_the_top_token(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1)
    drop = probs.cumsum(dim=-1) <= 1 - top_p  # WRONG: nothing forces the most likely token to stay
    return _mask(logits, drop, order)


@wrong("ch01.top_p", "top p one keeps everything")
def top_p_without_the_one_shortcut(logits, top_p):
    probs, order = logits.softmax(dim=-1).sort(dim=-1)  # WRONG: at top_p=1.0, probability-0 tokens are dropped
    drop = probs.cumsum(dim=-1) <= 1 - top_p
    drop[..., -1] = False
    return _mask(logits, drop, order)


@wrong("ch01.top_p", "dropped logits are minus infinity")
def top_p_fills_minus_a_billion(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1)
    drop = probs.cumsum(dim=-1) <= 1 - top_p
    drop[..., -1] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -1e9)  # WRONG: not -inf


@wrong("ch01.top_p", "kept logits are unchanged")
def top_p_renormalises(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1)
    drop = probs.cumsum(dim=-1) <= 1 - top_p
    drop[..., -1] = False
    return _mask(logits, drop, order).log_softmax(dim=-1)  # WRONG: returns log-probabilities, not the logits


@wrong("ch01.top_p", "to keep probabilities [0.5, 0.3]")
def top_p_forgets_to_unsort(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, _ = logits.softmax(dim=-1).sort(dim=-1)
    drop = probs.cumsum(dim=-1) <= 1 - top_p
    drop[..., -1] = False
    return logits.masked_fill(drop, float("-inf"))  # WRONG: the mask is in sorted order, not vocab order


@wrong("ch01.top_p", "filters each row of a batch on its own")
def top_p_one_row_only(logits, top_p):
    if top_p >= 1.0:
        return logits
    probs, order = logits.softmax(dim=0).sort(dim=0)  # WRONG: dim=0 is the batch for (batch, vocab)
    drop = probs.cumsum(dim=0) <= 1 - top_p
    drop[-1] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))


# ----------------------------------------------------------------------------- ch01.kv_decode


def _decode(model, prompt_ids, max_new_tokens, *, first_row=-1, extra=0, stop_at_eos=False, relative=False,
            fixed_start=False, batched=False, at_least_one=False, one_by_one=False, no_cache=False):
    """The solution with one mistake switched on (see the wrong answers below)."""
    cache = ContiguousKVCache.for_model(model.config, num_slots=1, max_len=len(prompt_ids) + max_new_tokens + 8,
                                        dtype=model.dtype, device=model.device)
    out: list[int] = []
    feed, start = list(prompt_ids), 0
    if one_by_one:  # feed the prompt a token at a time
        for token in prompt_ids[:-1]:
            model(torch.tensor([token]), torch.tensor([start]), cache.batch([0], [start], [1]))
            start += 1
        feed = prompt_ids[-1:]
    with torch.inference_mode():
        while len(out) < max_new_tokens + extra or (at_least_one and not out):
            if no_cache:
                feed, start = list(prompt_ids) + out, 0
                cache = ContiguousKVCache.for_model(model.config, 1, len(feed), model.dtype, model.device)
            ids = torch.tensor(feed)
            positions = torch.arange(len(feed)) if relative else torch.arange(start, start + len(feed))
            backend = cache.batch([0], [0 if fixed_start else start], [len(feed)])
            hidden = model(ids[None] if batched else ids, positions, backend)
            out.append(int(model.logits(hidden[first_row if not out else -1:][:1])[0].argmax()))
            if stop_at_eos and out[-1] in model.config.eos_token_ids:
                break
            start += len(feed)
            feed = [out[-1]]
    return out


@wrong("ch01.kv_decode", "returns exactly max new tokens: prompt [3, 1, 4, 1, 5], max_new_tokens=1")
def decode_one_token_too_many(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, extra=1)  # WRONG: the prefill's token plus n more


@wrong("ch01.kv_decode", "returns exactly max new tokens: prompt [3, 1, 4, 1, 5], max_new_tokens=0")
def decode_always_returns_the_prefill_token(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, at_least_one=True)  # WRONG: max_new_tokens=0 gives 1 token


@wrong("ch01.kv_decode", "prefills once then feeds one token per pass")
def decode_without_the_cache(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, no_cache=True)  # WRONG: recomputes the whole sequence


@wrong("ch01.kv_decode", "prefills once then feeds one token per pass")
def decode_prefills_one_token_at_a_time(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, one_by_one=True)  # WRONG: the prefill is one pass


@wrong("ch01.kv_decode", "each pass gets the positions of the tokens it feeds")
def decode_positions_restart_at_zero(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, relative=True)  # WRONG: decode tokens all at position 0


@wrong("ch01.kv_decode", "new token 0 is the argmax of the prefill's LAST position")
def decode_first_token_from_the_first_position(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, first_row=0)  # WRONG: hidden[0] is the first prompt token


@wrong("ch01.kv_decode", "the cache holding all before it")
def decode_overwrites_the_cache_start(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, fixed_start=True)  # WRONG: every pass writes at slot start 0


@wrong("ch01.kv_decode", "never stops early even at an end of sequence token")
def decode_stops_at_eos(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, stop_at_eos=True)  # WRONG: the contract says never stop early


@wrong("ch01.kv_decode", "input_ids as a 1-D tensor")
def decode_with_a_batch_dimension(model, prompt_ids, max_new_tokens):
    return _decode(model, prompt_ids, max_new_tokens, batched=True)  # WRONG: (1, n) tensors


# ----------------------------------------------------------------------------- ch02.slot_utilisation


@wrong("ch02.slot_utilisation", "counts the slots that ran at least one token")
def utilisation_sums_tokens(steps, num_slots):
    if not steps:
        return 0.0
    busy = sum(tokens for step in steps for tokens in step)  # WRONG: tokens, not busy slot-steps
    return busy / (len(steps) * num_slots)


@wrong("ch02.slot_utilisation", "counts the slots that ran at least one token")
def utilisation_counts_idle_slots(steps, num_slots):
    if not steps:
        return 0.0
    busy = sum(len(step) for step in steps)  # WRONG: a listed slot with 0 tokens was idle
    return busy / (len(steps) * num_slots)


@wrong("ch02.slot_utilisation", "slots missing from a step ran nothing")
def utilisation_over_listed_slots(steps, num_slots):
    if not steps:
        return 0.0
    busy = sum(1 for step in steps for tokens in step if tokens > 0)
    return busy / sum(len(step) for step in steps)  # WRONG: slots missing from a list count too


@wrong("ch02.slot_utilisation",
       "no steps is zero: slot_utilisation([], num_slots=4): expected 0.0000 (no steps at all), got ZeroDivisionError")
def utilisation_divides_by_zero(steps, num_slots):
    busy = sum(1 for step in steps for tokens in step if tokens > 0)  # WRONG: no guard for an empty trace
    return busy / (len(steps) * num_slots)


# ----------------------------------------------------------------------------- ch03.schedule_step


def _plan(running, waiting, free_slots, max_tokens_per_step, *, stop_running=False, admit_first=False,
          overtake=False, ignore_slots=False, full_budget=False, strict=False, running_use_slots=False):
    """The solution with one mistake switched on (see the wrong answers below)."""
    budget = max_tokens_per_step
    if running_use_slots:
        free_slots -= len(running)
    runs: list[tuple[str, int]] = []
    for request_id, need in running:
        if need <= budget:
            runs.append((request_id, need))
            budget -= need
        elif stop_running:
            break
    admitted: list[str] = []
    new: list[tuple[str, int]] = []
    budget = max_tokens_per_step if full_budget else budget
    for request_id, prompt_len in waiting:
        if (free_slots <= 0 and not ignore_slots) or prompt_len > budget or (strict and prompt_len == budget):
            if overtake:
                continue
            break
        new.append((request_id, prompt_len))
        admitted.append(request_id)
        budget -= prompt_len
        free_slots -= 1
    return (new + runs if admit_first else runs + new), admitted


@wrong("ch03.schedule_step", "a running request that does not fit waits and the others go on")
def plan_stops_at_a_running_request_that_does_not_fit(*args):
    return _plan(*args, stop_running=True)  # WRONG: break instead of skipping it


@wrong("ch03.schedule_step", "running requests come first then newcomers")
def plan_newcomers_first(*args):
    return _plan(*args, admit_first=True)  # WRONG: the admitted are listed before the running


@wrong("ch03.schedule_step", "nobody overtakes a waiting request that does not fit")
def plan_lets_small_requests_overtake(*args):
    return _plan(*args, overtake=True)  # WRONG: continue instead of break


@wrong("ch03.schedule_step", "admits only while a slot is free")
def plan_ignores_free_slots(*args):
    return _plan(*args, ignore_slots=True)  # WRONG: admits without a slot


@wrong("ch03.schedule_step", "admits only while the prompt fits what is left of the budget")
def plan_admits_against_the_full_budget(*args):
    return _plan(*args, full_budget=True)  # WRONG: forgets what the running requests took


@wrong("ch03.schedule_step", "a prompt that exactly fills the budget is admitted")
def plan_needs_room_to_spare(*args):
    return _plan(*args, strict=True)  # WRONG: < instead of <=


@wrong("ch03.schedule_step", "running requests need no free slot")
def plan_counts_running_requests_against_free_slots(*args):
    return _plan(*args, running_use_slots=True)  # WRONG: free_slots already excludes the running


# ----------------------------------------------------------------------------- ch04.allocate


@wrong("ch04.allocate", "allocate takes blocks from the front with ref count one")
class AllocatesFromTheBack(BlockAllocator):
    def allocate(self, num_blocks):
        if num_blocks > len(self.free_queue):
            raise MemoryError
        blocks = [self.free_queue.pop() for _ in range(num_blocks)]  # WRONG: pop() takes the back
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks


@wrong("ch04.allocate", "allocate that runs out raises memory error and takes nothing")
class AllocatesUntilItRunsOut(BlockAllocator):
    def allocate(self, num_blocks):
        blocks = []
        for _ in range(num_blocks):
            if not self.free_queue:
                raise MemoryError  # WRONG: the blocks taken so far are kept
            blocks.append(self.free_queue.pop(0))
            self.ref_counts[blocks[-1]] = 1
        return blocks


@wrong("ch04.allocate", "allocate can take the last free blocks")
class AllocateNeedsASpareBlock(BlockAllocator):
    def allocate(self, num_blocks):
        if num_blocks >= len(self.free_queue):  # WRONG: off by one, > is right
            raise MemoryError
        return super().allocate(num_blocks)


@wrong("ch04.allocate", "append adds a block only when the tokens cross a block boundary")
class AppendRoundsUpTooFar(BlockAllocator):
    def append(self, table, num_tokens):
        needed = num_tokens // self.block_size + 1 - len(table)  # WRONG: one block too many at a boundary
        new = self.allocate(needed) if needed > 0 else []
        table.extend(new)
        return new


@wrong("ch04.allocate", "append grows the table in place")
class AppendReturnsWithoutGrowing(BlockAllocator):
    def append(self, table, num_tokens):
        needed = -(-num_tokens // self.block_size) - len(table)
        return self.allocate(needed) if needed > 0 else []  # WRONG: the table itself is not extended


@wrong("ch04.allocate", "append never shrinks a table")
class AppendWithNegativeNeed(BlockAllocator):
    def append(self, table, num_tokens):
        new = self.allocate(-(-num_tokens // self.block_size) - len(table))  # WRONG: a negative need takes blocks
        table.extend(new)
        return new


@wrong("ch04.allocate", "append that runs out raises memory error and changes nothing")
class AppendsBlockByBlock(BlockAllocator):
    def append(self, table, num_tokens):
        new = []
        while len(table) * self.block_size < num_tokens:
            table.extend(self.allocate(1))  # WRONG: runs out halfway with the table already grown
            new.append(table[-1])
        return new


@wrong("ch04.allocate", "free returns blocks to the back of the queue in order")
class FreesToTheFront(BlockAllocator):
    def free(self, blocks):
        for block in blocks:
            if self.ref_counts[block] == 0:
                raise ValueError(f"double free of block {block}")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue.insert(0, block)  # WRONG: the back, not the front


@wrong("ch04.allocate", "in the order given")
class FreesInReverse(BlockAllocator):
    def free(self, blocks):
        super().free(list(reversed(blocks)))  # WRONG: vLLM frees tails first, but the contract says in order


@wrong("ch04.allocate", "a shared block returns only when its last holder frees it")
class FreeIgnoresSharing(BlockAllocator):
    def free(self, blocks):
        for block in blocks:
            if self.ref_counts[block] == 0:
                raise ValueError(f"double free of block {block}")
            self.ref_counts[block] = 0  # WRONG: other holders still use it
            self.free_queue.append(block)


@wrong("ch04.allocate", "freeing a free block raises value error")
class FreeWithoutTheDoubleFreeCheck(BlockAllocator):
    def free(self, blocks):
        for block in blocks:
            self.ref_counts[block] -= 1  # WRONG: a free block's count goes to -1, silently
            if self.ref_counts[block] == 0:
                self.free_queue.append(block)


@wrong("ch04.allocate", "incref of a free block raises value error")
class IncrefWithoutTheCheck(BlockAllocator):
    def incref(self, blocks):
        for block in blocks:
            self.ref_counts[block] += 1  # WRONG: a free block gains a holder while in the free queue


# ----------------------------------------------------------------------------- ch04.slot_mapping


def _slots(block_table, block_size, start, end, *, scale=True, inclusive=False, relative=False, bound=0):
    """The solution with one mistake switched on (see the wrong answers below)."""
    if bound is not None and end + bound > len(block_table) * block_size:
        raise ValueError("beyond the table")
    base = start if relative else 0
    return [block_table[(t - base) // block_size] * (block_size if scale else 1) + (t - base) % block_size
            for t in range(start, end + inclusive)]


@wrong("ch04.slot_mapping", "maps each token through the block table")
def slots_forget_the_block_size(block_table, block_size, start, end):
    return _slots(block_table, block_size, start, end, scale=False)  # WRONG: block + offset, not block * size + offset


@wrong("ch04.slot_mapping", "an empty range maps to no slots")
def slots_include_the_end(block_table, block_size, start, end):
    return _slots(block_table, block_size, start, end, inclusive=True)  # WRONG: [start, end] instead of [start, end)


@wrong("ch04.slot_mapping", "a window starts anywhere in the table")
def slots_count_from_the_window_start(block_table, block_size, start, end):
    return _slots(block_table, block_size, start, end, relative=True)  # WRONG: token t is t, not t - start


@wrong("ch04.slot_mapping", "positions past the table raise value error")
def slots_without_the_bound_check(block_table, block_size, start, end):
    return _slots(block_table, block_size, start, end, bound=None)  # WRONG: an IndexError escapes instead


@wrong("ch04.slot_mapping", "a range that exactly fills the table is fine")
def slots_bound_off_by_one(block_table, block_size, start, end):
    return _slots(block_table, block_size, start, end, bound=1)  # WRONG: rejects a range ending at the last slot


@wrong("ch04.slot_mapping", "maps each token through the block table")
def slots_ignore_the_table(block_table, block_size, start, end):
    if end > len(block_table) * block_size:
        raise ValueError("beyond the table")
    return list(range(start, end))  # WRONG: a token's slot is not its position


# ----------------------------------------------------------------------------- ch05.block_keys


@wrong("ch05.block_keys", "a partly filled last block has none")
def keys_for_every_block_partial_too(token_ids, block_size):
    keys = []
    for start in range(0, len(token_ids), block_size):  # WRONG: the partial last block gets a key too
        keys.append(hash((keys[-1] if keys else None, tuple(token_ids[start : start + block_size]), ())))
    return keys


@wrong("ch05.block_keys", "Each later key hashes the previous block's key")
def keys_without_the_chain(token_ids, block_size):
    return [hash((None, tuple(token_ids[s : s + block_size]), ()))  # WRONG: no parent key: position-blind
            for s in range(0, len(token_ids) - block_size + 1, block_size)]


@wrong("ch05.block_keys", "The first block's key is hash((None, tuple(tokens), ()))")
def keys_hash_lists_of_tokens_differently(token_ids, block_size):
    keys = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        keys.append(hash((keys[-1] if keys else 0, tuple(token_ids[start : start + block_size]), ())))  # WRONG: 0
    return keys


@wrong("ch05.block_keys", "The token list is left as it was")
def keys_that_consume_the_tokens(token_ids, block_size):
    keys = []
    while len(token_ids) >= block_size:
        block = [token_ids.pop(0) for _ in range(block_size)]  # WRONG: empties the caller's list
        keys.append(hash((keys[-1] if keys else None, tuple(block), ())))
    return keys


# ----------------------------------------------------------------------------- ch05.evict


@wrong("ch05.evict", "evicts from the front of evictable")
class EvictsTheMostRecentlyUsed(EvictingAllocator):
    def allocate(self, n):
        if n > len(self.free_queue) + len(self.evictable):
            raise MemoryError
        blocks = []
        for _ in range(n):
            block = self.free_queue.pop(0) if self.free_queue else self.evictable.pop()  # WRONG: the newest
            self.cached.discard(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks


@wrong("ch05.evict", "before evicting anything")
class EvictsBeforeUsingFreeBlocks(EvictingAllocator):
    def allocate(self, n):
        if n > len(self.free_queue) + len(self.evictable):
            raise MemoryError
        blocks = []
        for _ in range(n):
            block = self.evictable.pop(0) if self.evictable else self.free_queue.pop(0)  # WRONG: evicts first
            self.cached.discard(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks


@wrong("ch05.evict", "A released cached block goes to the back of evictable")
class ForgetsOnRelease(EvictingAllocator):
    def release(self, block):
        if self.ref_counts[block] == 0:
            raise ValueError(block)
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.cached.discard(block)  # WRONG: a released block's contents are thrown away
            self.free_queue.append(block)


@wrong("ch05.evict", "Asking for more than free plus evictable raises MemoryError")
class CountsOnlyFreeBlocks(EvictingAllocator):
    def allocate(self, n):
        if n > len(self.free_queue):  # WRONG: evictable blocks are available too
            raise MemoryError
        return super().allocate(n)


@wrong("ch05.evict", "A hit takes an evictable block out of evictable")
class HitLeavesTheBlockEvictable(EvictingAllocator):
    def hit(self, block):
        if block not in self.cached:
            raise ValueError(block)
        self.ref_counts[block] += 1  # WRONG: still in evictable: it could be evicted while held


@wrong("ch05.evict", "A block with two holders stays out of both lists")
class ReleasesOnFirstHolder(EvictingAllocator):
    def release(self, block):
        if self.ref_counts[block] == 0:
            raise ValueError(block)
        self.ref_counts[block] = 0  # WRONG: ignores the other holders
        (self.evictable if block in self.cached else self.free_queue).append(block)


# ----------------------------------------------------------------------------- ch05.reusable_blocks


def _reusable(token_ids, block_size, cache, key_fn, *, tokens=True, parent=True, stop=True, leave_one=True):
    found, key = [], None
    limit = (len(token_ids) - 1) // block_size if leave_one else len(token_ids) // block_size
    for start in range(0, limit * block_size, block_size):
        block = tuple(token_ids[start : start + block_size])
        key = key_fn(key, block)
        entry = cache.get(key)
        before = found[-1] if found else None
        ok = entry is not None and (not tokens or entry[1] == block) and (not parent or entry[2] == before)
        if not ok:
            if stop:
                break
            continue
        found.append(entry[0])
    return found


@wrong("ch05.reusable_blocks", "A key that collides with other tokens is a miss")
def reusable_trusts_the_key(token_ids, block_size, cache, key_fn):
    return _reusable(token_ids, block_size, cache, key_fn, tokens=False)  # WRONG: the key alone decides


@wrong("ch05.reusable_blocks", "the block before must be this request's too")
def reusable_ignores_the_block_before(token_ids, block_size, cache, key_fn):
    return _reusable(token_ids, block_size, cache, key_fn, parent=False)  # WRONG: same tokens, any beginning


@wrong("ch05.reusable_blocks", "At least one token is left to compute")
def reusable_takes_every_cached_block(token_ids, block_size, cache, key_fn):
    return _reusable(token_ids, block_size, cache, key_fn, leave_one=False)  # WRONG: nothing left for logits


@wrong("ch05.reusable_blocks", "Stops at the first miss")
def reusable_skips_a_miss(token_ids, block_size, cache, key_fn):
    return _reusable(token_ids, block_size, cache, key_fn, stop=False)  # WRONG: a block after a hole


# ----------------------------------------------------------------------------- ch06.chunked_step


@wrong("ch06.chunked_step", "Decodes come first")
def chunked_step_in_arrival_order(running, waiting, free_slots, max_tokens_per_step, max_prefill_chunk):
    budget, plan = max_tokens_per_step, []
    for request_id, need in running:  # WRONG: an older prefill goes before the decodes
        grant = min(need, max_prefill_chunk, budget)
        if grant > 0:
            plan.append((request_id, grant))
            budget -= grant
    for request_id, need in waiting:
        grant = min(need, max_prefill_chunk, budget)
        if free_slots == 0 or grant == 0:
            break
        plan.append((request_id, grant))
        budget -= grant
        free_slots -= 1
    return plan


@wrong("ch06.chunked_step", "at most one chunk")
def chunked_step_without_the_chunk_limit(running, waiting, free_slots, max_tokens_per_step, max_prefill_chunk):
    budget, plan = max_tokens_per_step, []
    for request_id, need in [r for r in running if r[1] == 1] + [r for r in running if r[1] > 1]:
        grant = min(need, budget)  # WRONG: a prefill takes all the budget allows, not one chunk
        if grant > 0:
            plan.append((request_id, grant))
            budget -= grant
    for request_id, need in waiting:
        grant = min(need, budget)
        if free_slots == 0 or grant == 0:
            break
        plan.append((request_id, grant))
        budget -= grant
        free_slots -= 1
    return plan


@wrong("ch06.chunked_step", "A prompt longer than the whole budget still starts")
def chunked_step_admitting_only_whole_chunks(running, waiting, free_slots, max_tokens_per_step, max_prefill_chunk):
    budget, plan = max_tokens_per_step, []
    for request_id, need in [r for r in running if r[1] == 1] + [r for r in running if r[1] > 1]:
        grant = min(need, max_prefill_chunk, budget)
        if grant > 0:
            plan.append((request_id, grant))
            budget -= grant
    for request_id, need in waiting:
        grant = min(need, max_prefill_chunk)
        if free_slots == 0 or grant > budget:  # WRONG: waits for room for a whole chunk
            break
        plan.append((request_id, grant))
        budget -= grant
        free_slots -= 1
    return plan


# ----------------------------------------------------------------------------- ch06.choose_chunk


def _steps(cost, contexts, prompt_len, size, decodes=True, prefix=True, grow=True):
    """The solution's step times, with one of its terms switchable off (a wrong answer's mistake)."""
    p0, p1, p2 = cost
    times, start, step = [], 0, 0
    while start < prompt_len:
        n = min(size, prompt_len - start)
        riding = contexts if decodes else []
        pairs = sum(c + (step if grow else 0) for c in riding) + (n * start if prefix else 0) + n * (n + 1) // 2
        times.append(p0 + p1 * (len(riding) + n) + p2 * pairs)
        start, step = start + n, step + 1
    return times


def _earliest(within):
    """The solution's choice among {size: its step times} within the target."""
    if not within:
        return None
    return min(within, key=lambda size: (sum(within[size]), max(within[size]), size))


@wrong("ch06.choose_chunk", "The decodes ride along in every step")
def choose_chunk_without_the_decodes(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = {}
    for size in sizes:
        times = _steps(cost, decode_contexts, prompt_len, size, decodes=False)  # WRONG: the prompt's chunk alone
        if max(times) <= itl_target:
            within[size] = times
    return _earliest(within)


@wrong("ch06.choose_chunk", "A later chunk attends to every prompt token before it")
def choose_chunk_as_if_every_chunk_started_the_prompt(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = {}
    for size in sizes:
        times = _steps(cost, decode_contexts, prompt_len, size, prefix=False)  # WRONG: n(n+1)/2 pairs, not n·s more
        if max(times) <= itl_target:
            within[size] = times
    return _earliest(within)


@wrong("ch06.choose_chunk", "Every step counts, not only the last")
def choose_chunk_checking_only_the_last_step(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = {}
    for size in sizes:
        times = _steps(cost, decode_contexts, prompt_len, size)
        if times[-1] <= itl_target:  # WRONG: the last chunk is the latest, but may be short
            within[size] = times
    return _earliest(within)


@wrong("ch06.choose_chunk", "The earliest first token among the sizes within the target")
def choose_chunk_smallest_within(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = [size for size in sizes if max(_steps(cost, decode_contexts, prompt_len, size)) <= itl_target]
    return min(within) if within else None  # WRONG: the smoothest steps, and the latest first token


@wrong("ch06.choose_chunk", "Sizes with the same first-token time: the one whose heaviest step is lightest")
def choose_chunk_largest_within(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = [size for size in sizes if max(_steps(cost, decode_contexts, prompt_len, size)) <= itl_target]
    return max(within) if within else None  # WRONG: a larger size can need as many steps, and be heavier


@wrong("ch06.choose_chunk", "Sizes with the same first-token time: the one whose heaviest step is lightest")
def choose_chunk_smallest_of_the_tied(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = {}
    for size in sizes:
        times = _steps(cost, decode_contexts, prompt_len, size)
        if max(times) <= itl_target:
            within[size] = times
    if not within:
        return None
    earliest = min(sum(times) for times in within.values())
    return min(size for size, times in within.items() if sum(times) == earliest)  # WRONG: smaller is not lighter


@wrong("ch06.choose_chunk", "A step exactly at the target is within it")
def choose_chunk_strictly_below(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = {}
    for size in sizes:
        times = _steps(cost, decode_contexts, prompt_len, size)
        if max(times) < itl_target:  # WRONG: at the target is within it
            within[size] = times
    return _earliest(within)


@wrong("ch06.choose_chunk", "A decode's context grows by one every step")
def choose_chunk_with_fixed_contexts(cost, decode_contexts, prompt_len, itl_target, sizes):
    within = {}
    for size in sizes:
        times = _steps(cost, decode_contexts, prompt_len, size, grow=False)  # WRONG: contexts stay where they were
        if max(times) <= itl_target:
            within[size] = times
    return _earliest(within)


# ----------------------------------------------------------------------------- ch07.acceptance


def _one_hot(guess: int, size: int) -> list[float]:
    return [1.0 if t == guess else 0.0 for t in range(size)]


@wrong("ch07.acceptance", "At the first rejection")
def acceptance_resampling_from_p(drafted, p, q, uniforms, draw):
    kept = []
    for i, guess in enumerate(drafted):
        q_i = q[i] if q is not None else _one_hot(guess, len(p[i]))
        if q_i[guess] > 0 and uniforms[i] < min(1.0, p[i][guess] / q_i[guess]):
            kept.append(guess)
            continue
        return kept + [draw(list(p[i]))]  # WRONG: resamples from p, not from the residual max(0, p - q)
    return kept + [draw(list(p[len(drafted)]))]


@wrong("ch07.acceptance", "accepted with probability p/q")
def acceptance_with_p_alone(drafted, p, q, uniforms, draw):
    kept = []
    for i, guess in enumerate(drafted):
        q_i = q[i] if q is not None else _one_hot(guess, len(p[i]))
        if uniforms[i] < p[i][guess]:  # WRONG: ignores q: accepts with probability p, not min(1, p / q)
            kept.append(guess)
            continue
        residual = [max(0.0, a - b) for a, b in zip(p[i], q_i)]
        total = sum(residual)
        return kept + [draw([r / total for r in residual] if total > 0 else list(p[i]))]
    return kept + [draw(list(p[len(drafted)]))]


@wrong("ch07.acceptance", "bonus comes from p[k]")
def acceptance_without_a_bonus(drafted, p, q, uniforms, draw):
    kept = []
    for i, guess in enumerate(drafted):
        q_i = q[i] if q is not None else _one_hot(guess, len(p[i]))
        if q_i[guess] > 0 and uniforms[i] < min(1.0, p[i][guess] / q_i[guess]):
            kept.append(guess)
            continue
        residual = [max(0.0, a - b) for a, b in zip(p[i], q_i)]
        total = sum(residual)
        return kept + [draw([r / total for r in residual] if total > 0 else list(p[i]))]
    return kept  # WRONG: all k accepted, but no bonus token drawn from p[k]


@wrong("ch07.acceptance", "residual summing to 0")
def acceptance_without_the_zero_sum_fallback(drafted, p, q, uniforms, draw):
    kept = []
    for i, guess in enumerate(drafted):
        q_i = q[i] if q is not None else _one_hot(guess, len(p[i]))
        if q_i[guess] > 0 and uniforms[i] < min(1.0, p[i][guess] / q_i[guess]):
            kept.append(guess)
            continue
        residual = [max(0.0, a - b) for a, b in zip(p[i], q_i)]
        return kept + [draw([r / sum(residual) for r in residual])]  # WRONG: divides by 0 when p = q but for rounding
    return kept + [draw(list(p[len(drafted)]))]


@wrong("ch07.acceptance", "Nothing after the first rejected guess")
def acceptance_skipping_rejections(drafted, p, q, uniforms, draw):
    kept = []
    for i, guess in enumerate(drafted):
        q_i = q[i] if q is not None else _one_hot(guess, len(p[i]))
        if q_i[guess] > 0 and uniforms[i] < min(1.0, p[i][guess] / q_i[guess]):
            kept.append(guess)  # WRONG: a rejected guess is skipped and the next ones still examined
    return kept + [draw(list(p[len(drafted)]))]


# ----------------------------------------------------------------------------- ch07.ngram


@wrong("ch07.ngram", "Longer n first")
def ngram_shortest_first(tokens, k, n_max, n_min):
    for n in range(n_min, min(n_max, len(tokens) - 1) + 1):  # WRONG: shortest n first
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@wrong("ch07.ngram", "most recent earlier match")
def ngram_oldest_match(tokens, k, n_max, n_min):
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - n):  # WRONG: the oldest match first
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@wrong("ch07.ngram", "overlap the suffix")
def ngram_without_overlap(tokens, k, n_max, n_min):
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - 2 * n, -1, -1):  # WRONG: the match must end before the suffix starts
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


# ----------------------------------------------------------------------------- ch07.best_k


def _fastest_of(speed: list[float]) -> int:
    best = 0
    for k in range(1, len(speed)):
        if speed[k] > speed[best]:
            best = k
    return best


@wrong("ch07.best_k", "Every guess costs a draft pass")
def best_k_most_tokens_per_pass(alpha, draft_cost, verify_cost):
    tokens = [sum(alpha**i for i in range(k + 1)) for k in range(len(verify_cost))]
    return _fastest_of([t / verify_cost[k] for k, t in enumerate(tokens)])  # WRONG: the draft's passes are free


@wrong("ch07.best_k", "plus the target's own token")
def best_k_without_the_bonus(alpha, draft_cost, verify_cost):
    tokens = [sum(alpha**i for i in range(k)) or 1.0 for k in range(len(verify_cost))]  # WRONG: 1 + ... + α^(k-1)
    return _fastest_of([t / (verify_cost[k] + k * draft_cost) for k, t in enumerate(tokens)])


@wrong("ch07.best_k", "k = 0 unless some k is strictly faster")
def best_k_always_speculates(alpha, draft_cost, verify_cost):
    tokens = [sum(alpha**i for i in range(k + 1)) for k in range(len(verify_cost))]
    speed = [t / (verify_cost[k] + k * draft_cost) for k, t in enumerate(tokens)]
    return max(range(1, len(speed)), key=lambda k: (speed[k], -k))  # WRONG: never answers "do not speculate"


@wrong("ch07.best_k", "costs verify_cost[k] decode steps")
def best_k_with_free_verification(alpha, draft_cost, verify_cost):
    tokens = [sum(alpha**i for i in range(k + 1)) for k in range(len(verify_cost))]
    return _fastest_of([t / (1 + k * draft_cost) for k, t in enumerate(tokens)])  # WRONG: a pass always costs 1


@wrong("ch07.best_k", "costs verify_cost[k] decode steps")
def best_k_verify_cost_off_by_one(alpha, draft_cost, verify_cost):
    tokens = [sum(alpha**i for i in range(k + 1)) for k in range(len(verify_cost))]
    return _fastest_of([t / (verify_cost[max(k - 1, 0)] + k * draft_cost)  # WRONG: the pass over k tokens
                        for k, t in enumerate(tokens)])


# ----------------------------------------------------------------------------- ch08.pad


def _pad_lists(rows, bucket, width, block_size, pad_block, pad_slot=None, context=lambda p: p + 1):
    padding = bucket - len(rows)
    pad_slot = pad_block * block_size if pad_slot is None else pad_slot
    return {"input_ids": [t for t, _, _ in rows] + [0] * padding, "positions": [p for _, p, _ in rows] + [0] * padding,
            "slot_mapping": [b[p // block_size] * block_size + p % block_size for _, p, b in rows]
            + [pad_slot] * padding,
            "block_tables": [list(b) + [pad_block] * (width - len(b)) for _, _, b in rows]
            + [[pad_block] * width for _ in range(padding)],
            "context_lens": [context(p) for _, p, _ in rows] + [1] * padding}


@wrong("ch08.pad", "smallest bucket that holds it")
def pad_to_the_largest_bucket(rows, buckets, width, block_size, pad_block):
    if len(rows) > buckets[-1]:
        return None
    return _pad_lists(rows, buckets[-1], width, block_size, pad_block)  # WRONG: always the largest bucket


@wrong("ch08.pad", "read and write only the pad block")
def padding_writes_into_slot_zero(rows, buckets, width, block_size, pad_block):
    bucket = next((b for b in buckets if b >= len(rows)), None)
    if bucket is None:
        return None
    return _pad_lists(rows, bucket, width, block_size, pad_block, pad_slot=0)  # WRONG: slot 0 is some request's


@wrong("ch08.pad", "context length is position + 1")
def context_without_the_new_token(rows, buckets, width, block_size, pad_block):
    bucket = next((b for b in buckets if b >= len(rows)), None)
    if bucket is None:
        return None
    return _pad_lists(rows, bucket, width, block_size, pad_block, context=lambda p: p)  # WRONG: its own token too


def _smallest_bucket(rows, buckets):
    return next((b for b in buckets if b >= len(rows)), None)


@wrong("ch08.pad", "The caller's rows are left unchanged")
def pad_extending_the_callers_tables(rows, buckets, width, block_size, pad_block):
    bucket = _smallest_bucket(rows, buckets)
    if bucket is None:
        return None
    for _, _, table in rows:
        table.extend([pad_block] * (width - len(table)))  # WRONG: pads the caller's own block tables in place
    return _pad_lists(rows, bucket, width, block_size, pad_block)


@wrong("ch08.pad", "context 1")
def padding_rows_with_context_zero(rows, buckets, width, block_size, pad_block):
    bucket = _smallest_bucket(rows, buckets)
    if bucket is None:
        return None
    batch = _pad_lists(rows, bucket, width, block_size, pad_block)
    batch["context_lens"][len(rows):] = [0] * (bucket - len(rows))  # WRONG: a padding row attends to its own token
    return batch


def pad_extending_the_tables_and_padding_with_context_zero(rows, buckets, width, block_size, pad_block):
    """Both mistakes at once (a learner walk's attempt): each must be reported by its own rule."""
    bucket = _smallest_bucket(rows, buckets)
    if bucket is None:
        return None
    for _, _, table in rows:
        table.extend([pad_block] * (width - len(table)))
    return padding_rows_with_context_zero(rows, buckets, width, block_size, pad_block)


# ----------------------------------------------------------------------------- ch08.fill


@wrong("ch08.fill", "same tensors, at the same addresses")
def fill_by_replacing_the_buffers(buffers, batch):
    for name, buffer in buffers.items():
        if torch.tensor(batch[name]).shape != buffer.shape:
            raise ValueError(name)
    for name, buffer in buffers.items():
        buffers[name] = torch.tensor(batch[name], dtype=buffer.dtype)  # WRONG: a new tensor the graph never saw


@wrong("ch08.fill", "raises ValueError")
def fill_without_checking_shapes(buffers, batch):
    for name, buffer in buffers.items():
        buffer.copy_(torch.tensor(batch[name], dtype=buffer.dtype))  # WRONG: a 1-row batch broadcasts into 4 rows


@wrong("ch08.fill", "changes nothing")
def fill_checking_as_it_goes(buffers, batch):
    for name, buffer in buffers.items():
        value = torch.tensor(batch[name], dtype=buffer.dtype)
        if value.shape != buffer.shape:  # WRONG: the buffers before this one are already overwritten
            raise ValueError(name)
        buffer.copy_(value)


# ----------------------------------------------------------------------------- ch08.buckets


def _mean_step_ms(chosen, seen, graph_ms, eager_ms, *, uncovered_free=False):
    total = 0.0
    for n, steps in seen.items():
        bucket = next((b for b in sorted(chosen) if b >= n), None)
        if bucket is None:
            total += 0.0 if uncovered_free else steps * eager_ms[n]
        else:
            total += steps * graph_ms[bucket]
    return total / sum(seen.values())


def _fastest(seen, capture_mib, budget_mib, graph_ms, eager_ms, *, uncovered_free=False, must_cover=False):
    best, best_key = [], None
    for size in range(0, len(capture_mib) + 1):
        for chosen in itertools.combinations(sorted(capture_mib), size):
            mib = sum(capture_mib[b] for b in chosen)
            if mib > budget_mib or (must_cover and (not chosen or chosen[-1] < max(seen))):
                continue
            key = (round(_mean_step_ms(chosen, seen, graph_ms, eager_ms, uncovered_free=uncovered_free), 9), mib)
            if best_key is None or key < best_key:
                best, best_key = list(chosen), key
    return best


@wrong("ch08.buckets", "runs eagerly, at its eager step time")
def buckets_smallest_first_until_the_budget_is_spent(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    chosen, used = [], 0.0
    for bucket in sorted(capture_mib):  # WRONG: small buckets first, whatever the batches that then run eagerly
        if used + capture_mib[bucket] > budget_mib:
            break
        chosen.append(bucket)
        used += capture_mib[bucket]
    return chosen


@wrong("ch08.buckets", "capture memory fits the budget")
def buckets_one_over_the_budget(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    chosen, used = [], 0.0
    wanted = sorted(capture_mib, key=lambda b: -sum(s for n, s in seen.items() if n <= b))
    for bucket in wanted:
        if used >= budget_mib:  # WRONG: checks the budget before adding, so the last bucket overshoots it
            break
        chosen.append(bucket)
        used += capture_mib[bucket]
    return sorted(chosen)


@wrong("ch08.buckets", "runs eagerly, at its eager step time")
def buckets_as_if_uncovered_batches_were_free(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    return _fastest(seen, capture_mib, budget_mib, graph_ms, eager_ms, uncovered_free=True)  # WRONG: eager costs


@wrong("ch08.buckets", "rare large batch may run eagerly")
def buckets_always_covering_the_largest_batch(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    # WRONG: a bucket for the largest batch at any price (falls back to [] when none fits)
    return _fastest(seen, capture_mib, budget_mib, graph_ms, eager_ms, must_cover=True)


@wrong("ch08.buckets", "the least capture memory")
def buckets_every_candidate_that_fits(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    if sum(capture_mib.values()) <= budget_mib:
        return sorted(capture_mib)  # WRONG: everything fits, so record everything (buckets no batch uses too)
    return _fastest(seen, capture_mib, budget_mib, graph_ms, eager_ms)


@wrong("ch08.buckets", "[] may be the fastest choice")
def buckets_never_all_eager(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    best, best_key = [], None
    for size in range(1, len(capture_mib) + 1):  # WRONG: [] is only the fallback when no bucket fits
        for chosen in itertools.combinations(sorted(capture_mib), size):
            mib = sum(capture_mib[b] for b in chosen)
            if mib > budget_mib:
                continue
            key = (round(_mean_step_ms(chosen, seen, graph_ms, eager_ms), 9), mib)
            if best_key is None or key < best_key:
                best, best_key = list(chosen), key
    return best


@wrong("ch08.buckets", "the one that keeps less memory")
def buckets_first_of_the_equally_fast(seen, capture_mib, budget_mib, graph_ms, eager_ms):
    best, best_ms = [], _mean_step_ms((), seen, graph_ms, eager_ms)
    for size in range(1, len(capture_mib) + 1):  # fewer buckets first, so a tie often keeps the smaller choice
        for chosen in itertools.combinations(sorted(capture_mib), size):
            if sum(capture_mib[b] for b in chosen) > budget_mib:
                continue
            ms = _mean_step_ms(chosen, seen, graph_ms, eager_ms)
            if ms < best_ms - 1e-9:  # WRONG: a tie keeps the first found, whatever the memory either keeps
                best, best_ms = list(chosen), ms
    return best


# ----------------------------------------------------------------------------- ch09.diagnose


def _diagnosis(dashboard):
    from solutions.ch09_diagnose import diagnose

    return diagnose(dashboard)


@wrong("ch09.diagnose", "the cause its symptoms point to")
def diagnose_blaming_the_kv_cache_for_everything(dashboard):
    return {"cause": "KV cache too small", "fix": {"num_blocks": 8192}}  # WRONG: memory is not every server's problem


@wrong("ch09.diagnose", "the cause its symptoms point to")
def diagnose_blaming_the_slots_for_any_queue(dashboard):
    if dashboard["waiting_max"] > 2 * dashboard["running_max"]:  # WRONG: a KV cache that fills up queues them too
        return {"cause": "too few batch slots", "fix": {"max_num_seqs": 64}}
    return _diagnosis(dashboard)


@wrong("ch09.diagnose", "the cause its symptoms point to")
def diagnose_blaming_long_prompts_for_any_itl_tail(dashboard):
    if dashboard["itl_p99_s"] > 3 * dashboard["itl_p50_s"] and dashboard["preemptions"] == 0:
        # WRONG: recomputing a long shared prefix makes long steps too; the prefix hit rate tells them apart
        return {"cause": "long prompts stall the decodes",
                "fix": {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 128}}
    return _diagnosis(dashboard)


@wrong("ch09.diagnose", "the cause its symptoms point to")
def diagnose_from_a_table_of_the_notebooks_servers(dashboard):
    from minillm.sim import lab

    # WRONG: the answers written down for the eight servers the notebook shows, recognised by their TTFT
    table = {lab.dashboard(name)["ttft_p99_s"]: _diagnosis(lab.dashboard(name)) for name in lab.SERVERS}
    return table.get(dashboard["ttft_p99_s"], {"cause": "too few batch slots", "fix": {"max_num_seqs": 64}})


@wrong("ch09.diagnose", "a dashboard shows symptoms, not settings")
def diagnose_reading_a_setting(dashboard):
    if dashboard["num_blocks"] < 512:  # WRONG: the dashboard does not show the settings
        return {"cause": "KV cache too small", "fix": {"num_blocks": 4096}}
    return _diagnosis(dashboard)


@wrong("ch09.diagnose", "one setting of")
def diagnose_changing_two_settings(dashboard):
    answer = _diagnosis(dashboard)
    if "prefix_cache" in answer["fix"]:
        answer["fix"]["max_num_seqs"] = 64  # WRONG: two knobs at once: which one fixed it?
    return answer


@wrong("ch09.diagnose", "the SLO met")
def diagnose_with_sixteen_slots_always(dashboard):
    answer = _diagnosis(dashboard)
    if "max_num_seqs" in answer["fix"]:
        answer["fix"] = {"max_num_seqs": 16}  # WRONG: a busy server needs the slots Little's law says it holds
    return answer


@wrong("ch09.diagnose", "the SLO met")
def diagnose_turning_chunking_on_alone(dashboard):
    answer = _diagnosis(dashboard)
    if "chunked_prefill" in answer["fix"]:
        answer["fix"] = {"chunked_prefill": True}  # WRONG: the chunk size in effect is unknown, and may be too big
    return answer


@wrong("ch09.diagnose", "the SLO met")
def diagnose_with_the_smallest_chunks(dashboard):
    answer = _diagnosis(dashboard)
    if "chunked_prefill" in answer["fix"]:
        # WRONG: tiny chunks keep the gaps short, but a long prompt's TTFT grows with its number of chunks
        answer["fix"] = {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 32}
    return answer


@wrong("ch09.diagnose", "the SLO met")
def diagnose_with_fixed_values(dashboard):
    answer = _diagnosis(dashboard)
    fixed = {"too few batch slots": {"max_num_seqs": 64}, "KV cache too small": {"num_blocks": 4096},
             "long prompts stall the decodes": {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 256}}
    # WRONG: the right causes, but values guessed once instead of read from the dashboard (a tighter ITL
    # target needs a smaller chunk)
    return {"cause": answer["cause"], "fix": fixed.get(answer["cause"], answer["fix"])}


@wrong("ch09.diagnose", "settings of the right type")
def diagnose_with_a_number_in_quotes(dashboard):
    answer = _diagnosis(dashboard)
    if "num_blocks" in answer["fix"]:
        answer["fix"] = {"num_blocks": str(answer["fix"]["num_blocks"])}  # WRONG: a string, not an integer
    return answer


# ----------------------------------------------------------------------------- ch05.copy_on_write


def _cow_write(self, seq, start, end, *, first=None, last_holder_copies=False, release=True, grow_first=True,
               check_copies=True):
    """prepare_write with one learner mistake switched on (the solution when every flag is left alone)."""
    if seq not in self.tables:
        raise ValueError(seq)
    table = self.tables[seq]
    grow = max(0, -(-end // self.block_size) - len(table))
    touched = range(start // self.block_size if first is None else first, (end - 1) // self.block_size + 1)
    shared = [i for i in touched if i < len(table)
              and (self.ref_counts[table[i]] > 1 or last_holder_copies and table[i] in self.forked)]
    if grow + len(shared) * check_copies > len(self.free_queue):
        raise MemoryError
    new = [self.free_queue.pop(0) for _ in range(grow)] if grow_first else []
    copies = []
    for i in shared:
        copy = self.free_queue.pop(0)
        self.ref_counts[copy] = 1
        self.ref_counts[table[i]] -= release
        copies.append((table[i], copy))
        table[i] = copy
    new += [] if grow_first else [self.free_queue.pop(0) for _ in range(grow)]
    for block in new:
        self.ref_counts[block] = 1
        table.append(block)
    return copies


@wrong("ch05.copy_on_write", "The last holder of a block writes in place")
class CopiesEveryForkedBlock(ForkingAllocator):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.forked = set()

    def fork(self, parent, child):
        table = super().fork(parent, child)
        self.forked.update(table)
        return table

    def prepare_write(self, seq, start, end):
        return _cow_write(self, seq, start, end, last_holder_copies=True)  # WRONG: "was forked", not "is shared"


@wrong("ch05.copy_on_write", "Only the blocks the write touches are copied")
class CopiesTheWholeSharedTable(ForkingAllocator):
    def prepare_write(self, seq, start, end):
        return _cow_write(self, seq, start, end, first=0)  # WRONG: full prompt blocks, never written, copied too


@wrong("ch05.copy_on_write", "A copy lets go of the shared block")
class KeepsHoldingTheSource(ForkingAllocator):
    def prepare_write(self, seq, start, end):
        return _cow_write(self, seq, start, end, release=False)  # WRONG: the source keeps the writer's count


@wrong("ch05.copy_on_write", "fork takes no block")
class CopiesTheLastBlockAtFork(ForkingAllocator):
    def fork(self, parent, child):
        table = super().fork(parent, child)
        copy = self.free_queue.pop(0)  # WRONG: an eager copy, made before anyone writes (and maybe never needed)
        self.ref_counts[copy] = 1
        self.ref_counts[table[-1]] -= 1
        table[-1] = self.tables[child][-1] = copy
        return table


@wrong("ch05.copy_on_write", "A forked table is the child's own list")
class AliasesTheParentsTable(ForkingAllocator):
    def fork(self, parent, child):
        if parent not in self.tables or child in self.tables:
            raise ValueError(child)
        for block in self.tables[parent]:
            self.ref_counts[block] += 1
        self.tables[child] = self.tables[parent]  # WRONG: one list for both: a copy in one lands in the other
        return self.tables[child]


@wrong("ch05.copy_on_write", "raises MemoryError and changes nothing")
class CountsOnlyTheNewBlocks(ForkingAllocator):
    def prepare_write(self, seq, start, end):
        return _cow_write(self, seq, start, end, check_copies=False)  # WRONG: the copies need free blocks too


@wrong("ch05.copy_on_write", "A write grows the table first, then copies")
class CopiesBeforeGrowing(ForkingAllocator):
    def prepare_write(self, seq, start, end):
        return _cow_write(self, seq, start, end, grow_first=False)  # WRONG: other block ids than the engine's


# ----------------------------------------------------------------------------- ch10.output_processor


@wrong("ch10.output_processor", "Only the longest end of the text")
class HoldsBackAFixedLength(OutputProcessor):
    def _could_become_a_stop_string(self):  # WRONG: max(len(stop)) - 1 characters, whatever they are
        longest = max((len(s) for s in self.stop), default=1) - 1
        return min(len(self.text) - self.released, longest)


@wrong("ch10.output_processor", "decode is given a few ids per token")
class DecodesTheWholeOutputEveryStep(OutputProcessor):
    def _add_tokens(self, token_ids, last):
        for token in token_ids:  # WRONG: the whole output decoded again for every token (same text, O(n²) work)
            self.all_ids = [*getattr(self, "all_ids", []), token]
            self.decode(self.all_ids)
        super()._add_tokens(token_ids, last)


@wrong("ch10.output_processor", "released only once the character is complete")
class ReleasesHalfCharacters(OutputProcessor):
    def _add_tokens(self, token_ids, last):
        self.text += "".join(self.decode([token]) for token in token_ids)  # WRONG: half a character goes out


@wrong("ch10.output_processor", "AbortRequest for the core")
class NeverTellsTheCore(OutputProcessor):
    def process(self, token_ids, finish_reason):
        delta, finish, _ = super().process(token_ids, finish_reason)
        return delta, finish, None  # WRONG: the core goes on generating tokens nobody will read


@wrong("ch10.output_processor", "split across tokens and across calls")
class LooksOnlyInTheNewText(OutputProcessor):
    def process(self, token_ids, finish_reason):
        self.new_from = len(self.text)
        return super().process(token_ids, finish_reason)

    def _stop_at(self):  # WRONG: only in the text this call added
        return min((at for s in self.stop if (at := self.text.find(s, self.new_from)) != -1), default=None)


@wrong("ch10.output_processor", "the one that starts first in the text")
class TakesTheFirstListed(OutputProcessor):
    def _stop_at(self):  # WRONG: the first stop string of the list that occurs, not the earliest in the text
        return next((at for s in self.stop if (at := self.text.find(s, self.released)) != -1), None)


@wrong("ch10.output_processor", "the text before it")
class KeepsTheStopString(OutputProcessor):
    def _stop_at(self):  # WRONG: cut after the stop string, which stays in the text
        return min((at + len(s) for s in self.stop if (at := self.text.find(s, self.released)) != -1), default=None)


# ----------------------------------------------------------------------------- ch10.front_ends


def _front_ends(step_ms, per_token, per_request, output_tokens, slots, cores, *, requests_per_step=None,
                request_work=True, own_core=True, rounding="ceil", at_least_one=True):
    requests = slots / output_tokens if requests_per_step is None else requests_per_step(slots, output_tokens)
    work = slots * per_token + (requests * per_request if request_work else 0)
    ratio = work / step_ms
    needed = {"ceil": math.ceil(ratio - 1e-9), "floor+1": int(ratio) + 1, "floor": int(ratio)}[rounding]
    needed = max(1, needed) if at_least_one else needed
    room = cores - 1 if own_core else cores
    return needed if needed <= room else None


@wrong("ch10.front_ends", "A request's own work counts once per request")
def front_ends_tokens_only(*args):
    return _front_ends(*args, request_work=False)  # WRONG: only the tokens' work


@wrong("ch10.front_ends", "A request's own work counts once per request")
def front_ends_every_request_every_step(*args):
    return _front_ends(*args, requests_per_step=lambda slots, n: slots)  # WRONG: every request ends every step


@wrong("ch10.front_ends", "keeps a core of its own")
def front_ends_on_every_core(*args):
    return _front_ends(*args, own_core=False)  # WRONG: forgets the engine core's own core


@wrong("ch10.front_ends", "fills exactly a step keeps up")
def front_ends_one_more_than_the_floor(*args):
    return _front_ends(*args, rounding="floor+1")  # WRONG: an exact fit asks for one more


@wrong("ch10.front_ends", "one front end is needed")
def front_ends_rounded_down(*args):
    return _front_ends(*args, rounding="floor", at_least_one=False)  # WRONG: the share of a process rounded down


# ----------------------------------------------------------------------------- ch11.token_mask


def _token_mask(transitions, accepting, state, vocab, eos_token_id, *, first_only=False, live_check=True,
                eos_as_text=False, msb_first=False, signed=False):
    from exercises.grading.ch11 import live_states

    live = live_states(transitions, accepting) if live_check else set(transitions) | set(accepting) | {
        t for moves in transitions.values() for t in moves.values()}
    words = [0] * ((len(vocab) + 31) // 32)
    for token, text in enumerate(vocab):
        if token == eos_token_id and not eos_as_text:
            allowed = state in accepting
        else:
            at = state if text else None
            for character in text[:1] if first_only else text:
                at = transitions.get(at, {}).get(character)
                if at is None:
                    break
            allowed = at is not None and at in live
        if allowed:
            words[token // 32] |= 1 << (31 - token % 32 if msb_first else token % 32)
    return [w - 2**32 if signed and w >= 2**31 else w for w in words]


@wrong("ch11.token_mask", "Every character of a token is walked")
def token_mask_first_character_only(*args):
    return _token_mask(*args, first_only=True)  # WRONG: a token judged by its first character


@wrong("ch11.token_mask", "ends in a dead end")
def token_mask_without_dead_ends(*args):
    return _token_mask(*args, live_check=False)  # WRONG: any state a token reaches will do


@wrong("ch11.token_mask", "The end-of-sequence token is allowed exactly in accepting states")
def token_mask_reads_the_end_token_as_text(*args):
    return _token_mask(*args, eos_as_text=True)  # WRONG: the end token walked like any other


@wrong("ch11.token_mask", "packed as the engine's bitmask")
def token_mask_most_significant_bit_first(*args):
    return _token_mask(*args, msb_first=True)  # WRONG: token 0 in bit 31


@wrong("ch11.token_mask", "unsigned words")
def token_mask_signed_words(*args):
    return _token_mask(*args, signed=True)  # WRONG: words read back as int32


# ----------------------------------------------------------------------------- ch11.guess_masks


def _guess_masks(matcher, guesses, *, accept=True, rollback="accepted", past_refusal=False, past_finish=False):
    masks = [set(matcher.allowed())]
    accepted = 0
    for guess in guesses:
        if accept:
            ok = matcher.accept(guess)
            if not ok and not past_refusal:
                break
            accepted += ok
            if ok and matcher.is_finished and not past_finish:
                break
        masks.append(set(matcher.allowed()))
    count = {"accepted": accepted, "all": len(guesses), "none": 0}[rollback]
    if count:
        matcher.rollback(count)
    return masks + [None] * (len(guesses) + 1 - len(masks))


@wrong("ch11.guess_masks", "Each row is masked after the guesses before it")
def guess_masks_all_from_the_current_state(matcher, guesses):
    return _guess_masks(matcher, guesses, accept=False)  # WRONG: every row gets today's mask


@wrong("ch11.guess_masks", "exactly the accepted guesses are rolled back")
def guess_masks_roll_back_every_guess(matcher, guesses):
    return _guess_masks(matcher, guesses, rollback="all")  # WRONG: refused guesses were never accepted


@wrong("ch11.guess_masks", "left where it was")
def guess_masks_without_rollback(matcher, guesses):
    return _guess_masks(matcher, guesses, rollback="none")  # WRONG: the guesses stay in the matcher


@wrong("ch11.guess_masks", "carry no mask (None)")
def guess_masks_past_a_refused_guess(matcher, guesses):
    return _guess_masks(matcher, guesses, past_refusal=True)  # WRONG: goes on filling after a refusal


@wrong("ch11.guess_masks", "finishes the grammar")
def guess_masks_past_the_end(matcher, guesses):
    return _guess_masks(matcher, guesses, past_finish=True)  # WRONG: fills rows after the grammar finished


# ----------------------------------------------------------------------------- ch11.fill_threads


def _fill_threads(fill_ms_per_row, fixed_ms, batch, forward_ms, handoff_ms, max_threads, *, own_thread_free=True,
                  whole_rows=True, ties="fewest", greedy=False):
    waits = []
    for threads in range(1, max_threads + 1):
        rows = math.ceil(batch / threads) if whole_rows else batch / threads
        handoff = threads * handoff_ms if threads > 1 or not own_thread_free else 0.0
        waits.append(max(0.0, fixed_ms + rows * fill_ms_per_row + handoff - forward_ms))
    if greedy:
        return next((t for t, w in enumerate(waits, start=1) if w <= 1e-9), max_threads)
    least = min(waits)
    best = [t for t, w in enumerate(waits, start=1) if w <= least + 1e-9]
    return best[0] if ties == "fewest" else best[-1]


@wrong("ch11.fill_threads", "costs no handoff")
def fill_threads_handoff_for_the_own_thread(*args):
    return _fill_threads(*args, own_thread_free=False)  # WRONG: the engine's thread pays a handoff too


@wrong("ch11.fill_threads", "Rows are whole")
def fill_threads_fractional_rows(*args):
    return _fill_threads(*args, whole_rows=False)  # WRONG: batch / T rows, as if rows could be split


@wrong("ch11.fill_threads", "the fewest threads")
def fill_threads_most_among_ties(*args):
    return _fill_threads(*args, ties="most")  # WRONG: among equal waits, the most threads


@wrong("ch11.fill_threads", "not always better")
def fill_threads_all_or_nothing(*args):
    return _fill_threads(*args, greedy=True)  # WRONG: the fewest that hide the fill, else every thread


# ----------------------------------------------------------------------------- ch12.quantize_int8


def _per_channel(weight, clip=1.0, *, over="rows", clamp=True, rounding=torch.round, zero_rows=True):
    w = weight.detach().float()
    if over == "rows":
        largest = w.abs().amax(dim=1)
    elif over == "columns":
        largest = w.abs().amax(dim=0)
    else:
        largest = w.abs().max().expand(w.shape[0])
    scale = torch.where(largest > 0, clip * largest / 127, torch.ones_like(largest)) if zero_rows else \
        clip * largest / 127
    codes = rounding(w / (scale[None, :] if over == "columns" else scale[:, None]))
    if clamp:
        codes = torch.clamp(codes, -127, 127)
    return codes.to(torch.int8), scale


@wrong("ch12.quantize_int8", "One scale per output row")
def quantize_per_channel_per_tensor(weight, clip=1.0):
    return _per_channel(weight, clip, over="tensor")  # WRONG: one scale for the whole matrix


@wrong("ch12.quantize_int8", "One scale per output row")
def quantize_per_channel_per_input_column(weight, clip=1.0):
    return _per_channel(weight, clip, over="columns")  # WRONG: max over the rows, one scale per input column


@wrong("ch12.quantize_int8", "clamped to ±127")
def quantize_per_channel_without_clamping(weight, clip=1.0):
    return _per_channel(weight, clip, clamp=False)  # WRONG: 254 wraps around in int8


@wrong("ch12.quantize_int8", "rounded to the nearest integer, not toward zero")
def quantize_per_channel_toward_zero(weight, clip=1.0):
    return _per_channel(weight, clip, rounding=torch.trunc)  # WRONG: .to(torch.int8) alone truncates


@wrong("ch12.quantize_int8", "goes to the even one")
def quantize_per_channel_halves_up(weight, clip=1.0):
    return _per_channel(weight, clip, rounding=lambda x: torch.floor(x + 0.5))  # WRONG: 2.5 -> 3


@wrong("ch12.quantize_int8", "A row of zeros gets scale 1")
def quantize_per_channel_divides_by_zero(weight, clip=1.0):
    return _per_channel(weight, clip, zero_rows=False)  # WRONG: a zero row's scale is 0, its codes 0 / 0


# ----------------------------------------------------------------------------- ch12.dequantize_int8


@wrong("ch12.dequantize_int8", "one scale per output row, not per input column")
def dequantize_per_channel_along_columns(codes, scale):
    return codes.float() * scale[None, :]  # WRONG: broadcast along the rows' inputs


@wrong("ch12.dequantize_int8", "codes * scale")
def dequantize_per_channel_divides(codes, scale):
    return codes.float() / scale[:, None]  # WRONG: the scale is a step size, not a count of steps


@wrong("ch12.dequantize_int8", "float32")
def dequantize_per_channel_keeps_the_codes_dtype(codes, scale):
    return (codes * scale[:, None]).to(codes.dtype)  # WRONG: back into int8


# ----------------------------------------------------------------------------- ch12.quantize_int4


def _groups(weight, group_size, *, axis="inputs", symmetric=False, from_minimum=True, rounding=torch.round,
            constant=True, per_tensor=False):
    n, k = weight.shape
    w = weight.detach().float()
    if axis == "inputs":
        grouped = w.reshape(n, k // group_size, group_size)  # (N, K/G, G): reduce the last
    elif axis == "strided":
        grouped = w.reshape(n, group_size, k // group_size).transpose(1, 2)  # every (K/G)-th input in a group
    else:
        grouped = w.T.reshape(k, n // group_size, group_size)  # groups of G output rows
    if per_tensor:
        low, high = w.min().expand(grouped.shape[:2]), w.max().expand(grouped.shape[:2])
    else:
        low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    if symmetric:
        largest = torch.maximum(low.abs(), high.abs())
        low, high = -largest, largest
    scale = (high - low) / 15
    if constant:
        scale = torch.where(high > low, scale, torch.ones_like(scale))
    shifted = grouped - low[..., None] if from_minimum else grouped
    codes = torch.clamp(rounding(shifted / scale[..., None]), 0, 15).to(torch.uint8)
    if axis == "inputs":
        codes = codes.reshape(n, k)
    elif axis == "strided":
        codes = codes.transpose(1, 2).reshape(n, k)
    else:
        codes, scale, low = codes.reshape(k, n).T, scale.T, low.T
    return codes, scale, low


@wrong("ch12.quantize_int4", "consecutive inputs, each group with its own scale and minimum")
def quantize_groups_strided(weight, group_size):
    return _groups(weight, group_size, axis="strided")  # WRONG: reshape(N, G, K/G): every K/G-th input


@wrong("ch12.quantize_int4", "one per group of output rows")
def quantize_groups_along_the_outputs(weight, group_size):
    return _groups(weight, group_size, axis="outputs")  # WRONG: G consecutive rows of a column share a scale


@wrong("ch12.quantize_int4", "each group with its own scale and minimum")
def quantize_groups_per_tensor(weight, group_size):
    return _groups(weight, group_size, per_tensor=True)  # WRONG: the whole matrix's range for every group


@wrong("ch12.quantize_int4", "Asymmetric")
def quantize_groups_symmetric(weight, group_size):
    return _groups(weight, group_size, symmetric=True)  # WRONG: [-max|w|, max|w|], half the codes unused


@wrong("ch12.quantize_int4", "steps up from the group's minimum")
def quantize_groups_forgetting_the_minimum(weight, group_size):
    return _groups(weight, group_size, from_minimum=False)  # WRONG: round(w / scale)


@wrong("ch12.quantize_int4", "not toward zero")
def quantize_groups_toward_zero(weight, group_size):
    return _groups(weight, group_size, rounding=torch.trunc)  # WRONG: truncated


@wrong("ch12.quantize_int4", "A constant group gets scale 1")
def quantize_groups_divides_by_zero(weight, group_size):
    return _groups(weight, group_size, constant=False)  # WRONG: a constant group's scale is 0


# ----------------------------------------------------------------------------- ch12.dequantize_int4


@wrong("ch12.dequantize_int4", "The group's minimum is added back")
def dequantize_groups_forgetting_the_minimum(codes, scale, minimum):
    group_size = codes.shape[1] // scale.shape[1]
    return codes.float() * scale.repeat_interleave(group_size, dim=1)  # WRONG: no minimum


@wrong("ch12.dequantize_int4", "uses group k // G's scale and minimum")
def dequantize_groups_tiled(codes, scale, minimum):
    group_size = codes.shape[1] // scale.shape[1]
    return codes.float() * scale.repeat(1, group_size) + minimum.repeat(1, group_size)  # WRONG: k % groups


@wrong("ch12.dequantize_int4", "float32")
def dequantize_groups_in_half_precision(codes, scale, minimum):
    group_size = codes.shape[1] // scale.shape[1]
    out = codes.float() * scale.repeat_interleave(group_size, dim=1) + minimum.repeat_interleave(group_size, dim=1)
    return out.half()  # WRONG: not float32


# ----------------------------------------------------------------------------- ch12.fastest_scheme


def _fastest_scheme(schemes, num_weights, kv_bytes_per_token, context_lengths, bandwidth_gb_s, tflops, *,
                    combine=max, group_bytes=True, kv=True, per_token_unpacking=True, batch_flops=True,
                    ties="first"):
    times = []
    batch = len(context_lengths)
    for name, s in schemes.items():
        moved = num_weights * s["bits"] / 8 + (sum(context_lengths) * kv_bytes_per_token if kv else 0)
        if group_bytes and s["group_size"] is not None:
            moved += num_weights / s["group_size"] * s["group_bytes"]
        unpacking = num_weights * s["dequant_flops"] * (batch if per_token_unpacking else 1)
        flops = (batch if batch_flops else 1) * num_weights * 2 + (unpacking if batch_flops else
                                                                   num_weights * s["dequant_flops"])
        times.append((1000 * combine(moved / (bandwidth_gb_s * 1e9), flops / (tflops * 1e12)), name))
    least = min(t for t, _ in times)
    best = [name for t, name in times if t <= least + 1e-9]
    return best[0] if ties == "first" else best[-1]


@wrong("ch12.fastest_scheme", "not their sum")
def fastest_scheme_adds_reading_and_computing(*args):
    return _fastest_scheme(*args, combine=lambda a, b: a + b)  # WRONG: no overlap of bytes and arithmetic


@wrong("ch12.fastest_scheme", "The scales of each group are bytes too")
def fastest_scheme_without_group_bytes(*args):
    return _fastest_scheme(*args, group_bytes=False)  # WRONG: only the codes' bits are read


@wrong("ch12.fastest_scheme", "Every cached token is read too")
def fastest_scheme_without_the_kv_cache(*args):
    return _fastest_scheme(*args, kv=False)  # WRONG: only the weights are read


@wrong("ch12.fastest_scheme", "The unpacking is paid for every token")
def fastest_scheme_unpacks_once_per_step(*args):
    return _fastest_scheme(*args, per_token_unpacking=False)  # WRONG: each weight unpacked once per step


@wrong("ch12.fastest_scheme", "bound by arithmetic, which grows with the batch")
def fastest_scheme_flops_of_one_token(*args):
    return _fastest_scheme(*args, batch_flops=False)  # WRONG: the FLOPs of one token, whatever the batch


@wrong("ch12.fastest_scheme", "the first scheme in the dict's order")
def fastest_scheme_last_among_ties(*args):
    return _fastest_scheme(*args, ties="last")  # WRONG: among equal times, the last


# ----------------------------------------------------------------------------- ch13.column_shard


def _shard_piece(length, rank, size, check=True):
    if check and length % size:
        raise ValueError(f"{size} ranks cannot share {length} equally")
    per = length // size
    return slice(rank * per, (rank + 1) * per)


@wrong("ch13.column_shard", "contiguous output rows")
def column_shard_strided(weight, bias, rank, size):
    _shard_piece(weight.shape[0], rank, size)
    return weight[rank::size], None if bias is None else bias[rank::size]  # WRONG: every size-th row, interleaved


@wrong("ch13.column_shard", "contiguous output rows")
def column_shard_splits_the_inputs(weight, bias, rank, size):
    columns = _shard_piece(weight.shape[1], rank, size)
    return weight[:, columns], bias  # WRONG: the input columns, the row-parallel split


@wrong("ch13.column_shard", "The bias is split like the rows")
def column_shard_whole_bias_on_every_rank(weight, bias, rank, size):
    return weight[_shard_piece(weight.shape[0], rank, size)], bias  # WRONG: the whole bias, not its rows' entries


@wrong("ch13.column_shard", "contiguous output rows")
def column_shard_next_piece(weight, bias, rank, size):
    rows = _shard_piece(weight.shape[0], (rank + 1) % size, size)  # WRONG: off by one piece
    return weight[rows], None if bias is None else bias[rows]


@wrong("ch13.column_shard", "contiguous output rows")
def column_shard_one_row_too_many(weight, bias, rank, size):
    _shard_piece(weight.shape[0], rank, size)
    per = weight.shape[0] // size
    rows = slice(rank * per, (rank + 1) * per + 1)  # WRONG: the end taken as inclusive
    return weight[rows], None if bias is None else bias[rows]


@wrong("ch13.column_shard", "refused with ValueError")
def column_shard_without_the_size_check(weight, bias, rank, size):
    rows = _shard_piece(weight.shape[0], rank, size, check=False)  # WRONG: the last rows go to no rank
    return weight[rows], None if bias is None else bias[rows]


# ----------------------------------------------------------------------------- ch13.row_shard


@wrong("ch13.row_shard", "The bias is added once")
def row_shard_bias_on_every_rank(weight, bias, rank, size):
    return weight[:, _shard_piece(weight.shape[1], rank, size)], bias  # WRONG: summed, it counts size times


@wrong("ch13.row_shard", "The bias is added once")
def row_shard_bias_split_like_a_column(weight, bias, rank, size):
    columns = _shard_piece(weight.shape[1], rank, size)
    # WRONG: the bias split as a column-parallel layer's is; its entries belong to outputs, which are not split
    return weight[:, columns], None if bias is None else bias[_shard_piece(bias.shape[0], rank, size, check=False)]


@wrong("ch13.row_shard", "contiguous input columns")
def row_shard_strided(weight, bias, rank, size):
    _shard_piece(weight.shape[1], rank, size)
    return weight[:, rank::size], bias if rank == 0 else None  # WRONG: every size-th column, interleaved


@wrong("ch13.row_shard", "contiguous input columns")
def row_shard_splits_the_outputs(weight, bias, rank, size):
    rows = _shard_piece(weight.shape[0], rank, size)
    return weight[rows], bias if rank == 0 else None  # WRONG: the output rows, the column-parallel split


@wrong("ch13.row_shard", "contiguous input columns")
def row_shard_previous_piece(weight, bias, rank, size):
    columns = _shard_piece(weight.shape[1], (rank - 1) % size, size)  # WRONG: off by one piece
    return weight[:, columns], bias if rank == 0 else None


@wrong("ch13.row_shard", "refused with ValueError")
def row_shard_without_the_size_check(weight, bias, rank, size):
    columns = _shard_piece(weight.shape[1], rank, size, check=False)  # WRONG: the last inputs are dropped
    return weight[:, columns], bias if rank == 0 else None


# ----------------------------------------------------------------------------- ch13.allreduce_points


_TP_KINDS = {
    "input_layernorm": "replicated", "post_attention_layernorm": "replicated", "residual_add": "replicated",
    "qkv_proj": "column", "gate_up_proj": "column",
    "rope": "local", "attention": "local", "silu_mul": "local",
    "o_proj": "row", "down_proj": "row",
}


def _kinds(block):
    for op in block:
        if op not in _TP_KINDS:
            raise ValueError(f"unknown operation {op!r}")
    return [_TP_KINDS[op] for op in block]


@wrong("ch13.allreduce_points", "no all-reduce after it")
def allreduce_points_after_every_linear_layer(block):
    return [i for i, kind in enumerate(_kinds(block)) if kind in ("column", "row")]  # WRONG: column layers too


@wrong("ch13.allreduce_points", "A column-parallel layer writes whole values")
def allreduce_points_after_column_parallel_layers(block):
    return [i for i, kind in enumerate(_kinds(block)) if kind == "column"]  # WRONG: their outputs are final


@wrong("ch13.allreduce_points", "The sum comes before the residual add")
def allreduce_points_after_the_residual_add(block):
    kinds, points = _kinds(block), []
    for i, kind in enumerate(kinds):
        if kind == "row":  # WRONG: the residual is added to each rank's partial sum first
            points.append(i + 1 if i + 1 < len(block) and block[i + 1] == "residual_add" else i)
    return points


@wrong("ch13.allreduce_points", "refused with ValueError")
def allreduce_points_skips_unknown_operations(block):
    return [i for i, op in enumerate(block) if op in ("o_proj", "down_proj")]  # WRONG: an unknown name passes


@wrong("ch13.allreduce_points", "Two blocks: two all-reduces per block")
def allreduce_points_the_examples_answer(block):
    _kinds(block)
    # WRONG: the example's positions, remembered rather than derived
    return [i for i in (4, 9) if i < len(block) and _TP_KINDS[block[i]] == "row"]


# ----------------------------------------------------------------------------- ch13.allreduce_bytes


@wrong("ch13.allreduce_bytes", "Two all-reduces per layer")
def allreduce_bytes_one_per_layer(num_tokens, hidden_size, dtype_bytes, num_layers):
    return num_layers * num_tokens * hidden_size * dtype_bytes  # WRONG: only the MLP's (or only attention's)


@wrong("ch13.allreduce_bytes", "Two all-reduces per layer")
def allreduce_bytes_after_every_linear_layer(num_tokens, hidden_size, dtype_bytes, num_layers):
    return 4 * num_layers * num_tokens * hidden_size * dtype_bytes  # WRONG: the column layers need none


@wrong("ch13.allreduce_bytes", "every token's hidden state")
def allreduce_bytes_of_one_token(num_tokens, hidden_size, dtype_bytes, num_layers):
    return 2 * num_layers * hidden_size * dtype_bytes  # WRONG: per token, not per forward pass over num_tokens


@wrong("ch13.allreduce_bytes", "Bytes, not numbers")
def allreduce_bytes_counts_numbers(num_tokens, hidden_size, dtype_bytes, num_layers):
    return 2 * num_layers * num_tokens * hidden_size  # WRONG: the numbers, not their bytes


@wrong("ch13.allreduce_bytes", "not the embedding's")
def allreduce_bytes_with_the_embedding(num_tokens, hidden_size, dtype_bytes, num_layers):
    return (2 * num_layers + 1) * num_tokens * hidden_size * dtype_bytes  # WRONG: the embedding's all-reduce too
