"""The detokenizer's request options — the earliest stop string in the text wins whatever the list
order, include_stop_str_in_output, min_tokens delaying stop strings, skip_special_tokens — alone and
through the engine; and the prefix cache's counters: a preempted request finding its own blocks
again is counted apart (`readmitted_*`), so the hit rate stays 0 where no two prompts share anything."""

from __future__ import annotations

import pytest

from minillm.config import EngineConfig
from minillm.detokenizer import IncrementalDetokenizer
from minillm.engine import LLMEngine
from minillm.generate import generate_with_cache
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from tests.test_engine import paged_budget


class PieceTokenizer:
    """Token i is the string pieces[i] (several characters each); ids in `special` are special."""

    def __init__(self, pieces: list[str], special: frozenset[int] = frozenset()):
        self.pieces, self.special = pieces, special

    def decode(self, ids, skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i in self.special))


PIECES = ["<s>", "</s>", "x", "y", "abc", "z", "he", "llo wor", "ld", "a", "b", "c"]
SPECIAL = frozenset({0, 1})
TOKENS = {piece: i for i, piece in enumerate(PIECES)}


def stream(pieces: list[str], **options) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(PieceTokenizer(PIECES, SPECIAL), [TOKENS["<s>"]], **options)
    deltas = []
    for piece in pieces:
        deltas.append(detok.push(TOKENS[piece]))
        if detok.stopped_by is not None:
            break
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.text  # whatever was streamed is the text, nothing past a stop
    return deltas, detok


@pytest.mark.parametrize("stop", [("bc", "ab"), ("ab", "bc")])
def test_one_token_completing_two_stop_strings_stops_at_the_earliest_in_the_text(stop):
    _, detok = stream(["x", "y", "abc", "z"], stop=stop)
    assert detok.text == "xy" and detok.stopped_by == "ab"
    _, detok = stream(["x", "y", "abc", "z"], stop=stop, include_stop_str=True)
    assert detok.text == "xyab" and detok.stopped_by == "ab"


@pytest.mark.parametrize("stop", [("world", "llo"), ("llo", "world"), ("o w", "world", "llo")])
def test_earliest_match_wins_over_the_list_order_across_tokens(stop):
    _, detok = stream(["he", "llo wor", "ld", "x"], stop=stop)
    assert detok.text == "he" and detok.stopped_by == "llo"


def test_stop_strings_starting_at_the_same_place_take_the_first_listed():
    _, detok = stream(["x", "abc"], stop=("abc", "ab"))
    assert detok.text == "x" and detok.stopped_by == "abc"
    _, detok = stream(["x", "abc"], stop=("ab", "abc"), include_stop_str=True)
    assert detok.text == "xab" and detok.stopped_by == "ab"


def test_include_stop_str_keeps_the_stop_string_and_nothing_after_it():
    deltas, detok = stream(["he", "llo wor", "ld", "z"], stop=("wor",), include_stop_str=True)
    assert detok.text == "hello wor" and detok.stopped_by == "wor"
    _, detok = stream(["he", "llo wor", "ld", "z"], stop=("wor",))
    assert detok.text == "hello "


def test_a_stop_string_spanning_tokens_is_found():
    _, detok = stream(["x", "a", "b", "c"], stop=("abc",))
    assert detok.text == "x" and detok.stopped_by == "abc"


def test_min_tokens_delays_stop_strings():
    # the first two tokens' text can never stop the request; later text can
    _, detok = stream(["a", "b", "x", "a", "y"], stop=("a",), min_tokens=2)
    assert detok.text == "abx" and detok.stopped_by == "a"
    _, detok = stream(["a", "b", "x", "y"], stop=("a",), min_tokens=2)
    assert detok.text == "abxy" and detok.stopped_by is None
    _, detok = stream(["a", "b", "x", "y"], stop=("a",), min_tokens=0)
    assert detok.text == "" and detok.stopped_by == "a"
    _, detok = stream(["x", "y", "abc"], stop=("ab",), min_tokens=2, include_stop_str=True)
    assert detok.text == "xyab"  # the third token is past min_tokens: it stops


def test_skip_special_tokens_false_keeps_them_in_the_text():
    _, kept = stream(["x", "</s>", "<s>", "y"], skip_special_tokens=False)
    assert kept.text == "x</s><s>y"
    _, skipped = stream(["x", "</s>", "<s>", "y"])
    assert skipped.text == "xy"


def test_for_request_takes_every_option_from_the_params():
    params = SamplingParams(stop=("b",), include_stop_str_in_output=True, skip_special_tokens=False, min_tokens=1,
                            max_new_tokens=5)
    detok = IncrementalDetokenizer.for_request(PieceTokenizer(PIECES, SPECIAL), [0], params)
    text = "".join(detok.push(TOKENS[p]) for p in ["b", "</s>", "a", "b", "c"]) + detok.flush()
    assert text == detok.text == "b</s>ab" and detok.stopped_by == "b"


# ---------------------------------------------------------------------------------------- through the engine
class SpecialByteTokenizer(ByteTokenizer):
    """ByteTokenizer whose EOS (2) and BOS (1) are special tokens written "</s>" and "<s>"."""

    names = {1: "<s>", 2: "</s>"}

    def decode(self, ids, skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> str:
        text, run = "", []
        for i in ids:
            if i in self.names:
                text += bytes(run).decode("utf-8", errors="replace") + ("" if skip_special_tokens else self.names[i])
                run = []
            else:
                run.append(i)
        return text + bytes(run).decode("utf-8", errors="replace")


@pytest.mark.parametrize("skip", [True, False])
def test_engine_text_keeps_special_tokens_only_when_asked(model, skip):
    tokenizer = SpecialByteTokenizer()
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True, logit_bias={2: 100.0},
                            skip_special_tokens=skip)
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=2, max_model_len=64))
    request = engine.add_request([40, 41, 42], params)
    while engine.has_unfinished():
        engine.step()
    out = engine.output(request.request_id)
    assert out.token_ids == [2, 2, 2, 2]  # EOS, ignored: four times
    assert out.text == ("" if skip else "</s>" * 4)
    assert generate_with_cache(model, tokenizer, [40, 41, 42], params).text == out.text


def test_engine_stop_strings_min_tokens_and_include_match_the_naive_loop(model):
    prompt = [5, 6, 7, 8] * 3
    free = generate_with_cache(model, ByteTokenizer(), prompt,
                               SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)).token_ids
    printable = [t for t in free if 32 <= t < 127]
    assert len(printable) >= 2
    first, second = chr(printable[0]), chr(printable[1])
    cases = [SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True, stop=(second, first)),
             SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True, stop=(first,),
                            include_stop_str_in_output=True),
             SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True, stop=(first,),
                            min_tokens=free.index(printable[0]) + 1)]
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=4, max_model_len=64))
    ids = [engine.add_request(prompt, p).request_id for p in cases]
    while engine.has_unfinished():
        engine.step()
    for request_id, params in zip(ids, cases):
        out = engine.output(request_id)
        loop = generate_with_cache(model, ByteTokenizer(), prompt, params)
        assert (out.token_ids, out.text, out.finish_reason) == (loop.token_ids, loop.text, loop.finish_reason)
    cut = free.index(printable[0])
    assert engine.output(ids[0]).token_ids == free[: cut + 1]  # the earliest of the two, whatever the order
    assert engine.output(ids[1]).text.endswith(first)
    assert len(engine.output(ids[2]).token_ids) > cut + 1  # min_tokens let that first one pass


# ---------------------------------------------------------------------------------------- prefix-cache counters
def test_a_preempted_requests_readmission_is_not_a_prefix_cache_hit(model):
    """No two prompts share a block, but a preempted request finds its own blocks again when it
    comes back: that counts in readmitted_*, and the hit rate (what /metrics reports) stays 0.

    A (3-token prompt) grows to 5 blocks, B (16-token prompt, 4 full blocks) to 6, in a pool of 8:
    B, the newest, is preempted; A takes B's tail blocks, B's head blocks stay cached for B."""
    prompts = [[10, 11, 12], [20 + i for i in range(16)]]
    config = EngineConfig(max_num_seqs=4, max_model_len=64, max_tokens_per_step=64, kv="paged", block_size=4,
                          prefix_cache=True, kv_cache_bytes=paged_budget(model, 4, 8))
    engine = LLMEngine(model, ByteTokenizer(), config)
    limits = [16, 8]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)).request_id
           for p, n in zip(prompts, limits)]
    while engine.has_unfinished():
        engine.step()
    cache = engine.pool.cache
    assert engine.num_preemptions > 0
    assert cache.hit_tokens == 0 and cache.hit_rate == 0.0 and engine.prefix_cache_hit_rate == 0.0
    assert cache.queried_tokens == sum(len(p) for p in prompts)  # first admissions only
    assert cache.readmitted_queried_tokens > 0 and cache.readmitted_hit_tokens > 0  # B found its own blocks
    for request_id, prompt, n in zip(ids, prompts, limits):
        out = engine.output(request_id)
        assert out.num_cached_tokens == 0
        assert out.token_ids == generate_with_cache(model, ByteTokenizer(), prompt, SamplingParams(
            temperature=0, max_new_tokens=n, ignore_eos=True)).token_ids
    # a real share afterwards counts as a hit; readmissions stay apart
    readmitted = (cache.readmitted_queried_tokens, cache.readmitted_hit_tokens)
    request = engine.add_request(prompts[1] + [99], SamplingParams(temperature=0, max_new_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.output(request.request_id).num_cached_tokens == cache.hit_tokens == 16
    assert engine.prefix_cache_hit_rate == pytest.approx(16 / (sum(len(p) for p in prompts) + 17))
    assert (cache.readmitted_queried_tokens, cache.readmitted_hit_tokens) == readmitted
