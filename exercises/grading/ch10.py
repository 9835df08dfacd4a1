"""Chapter 10's cases: `ch10.output_processor` (the front end's half of one request: token ids in, text
deltas out, stop strings found across deltas, the abort sent to the core) and `ch10.front_ends` (how many
front-end processes keep pace with one engine core)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from exercises.grading.core import call, exercise, expect
from minillm.engine_core.messages import AbortRequest

processor = exercise("ch10.output_processor", "ch10_output_processor", "OutputProcessor")
front_ends = exercise("ch10.front_ends", "ch10_front_ends", "front_end_processes")

# ----------------------------------------------------------------------------- a byte-level tokenizer

# Every byte is a token; a few common pieces are tokens too. "é" (2 bytes) and "🙂" (4 bytes) have no token
# of their own: they always come in pieces, as a byte-level tokenizer cuts a character it has not merged.
PIECES = [b"the", b" the", b"ing", b" and", b"ROMEO", b"END", b" wor", b"ld", b"er", b"\xf0\x9f", b"\x99\x82"]
VOCAB = [bytes([b]) for b in range(256)] + PIECES


def encode(text: str) -> list[int]:
    """Greedy longest match over the bytes of `text`."""
    data, ids, i = text.encode(), [], 0
    by_length = sorted(range(len(VOCAB)), key=lambda t: -len(VOCAB[t]))
    while i < len(data):
        token = next(t for t in by_length if data.startswith(VOCAB[t], i))
        ids.append(token)
        i += len(VOCAB[token])
    return ids


def decode(ids: Sequence[int]) -> str:
    return b"".join(VOCAB[t] for t in ids).decode("utf-8", errors="replace")


class CountingDecode:
    """decode, counting the ids it is given (the work per token must stay bounded)."""

    def __init__(self):
        self.ids = 0

    def __call__(self, ids: Sequence[int]) -> str:
        self.ids += len(ids)
        return decode(list(ids))

    def __repr__(self) -> str:
        return "decode"


# ----------------------------------------------------------------------------- the rules, as the grader knows them


class Reference:
    """What process() must return, call by call (the notebook states the same rules)."""

    def __init__(self, request_id: str, stop: Sequence[str]):
        self.request_id, self.stop = request_id, list(stop)
        self.pending: list[int] = []
        self.text, self.released, self.finish = "", 0, None

    def process(self, token_ids: Sequence[int], finish_reason: str | None) -> tuple:
        if self.finish is not None:
            return "", self.finish, None
        for token in token_ids:
            self.pending.append(token)
            piece = decode(self.pending)
            if not piece.endswith("\ufffd"):
                self.text, self.pending = self.text + piece, []
        if finish_reason is not None and self.pending:
            self.text, self.pending = self.text + decode(self.pending), []
        found = [at for s in self.stop if (at := self.text.find(s, self.released)) != -1]
        if found:
            at = min(found)
            delta, self.text, self.released, self.finish = self.text[self.released : at], self.text[:at], at, "stop"
            return delta, "stop", AbortRequest(self.request_id)
        end = len(self.text)
        if finish_reason is not None:
            self.finish = finish_reason
        else:
            tail = self.text[self.released :]
            end -= next((k for k in range(len(tail), 0, -1) if any(s.startswith(tail[-k:]) for s in self.stop)), 0)
        delta, self.released = self.text[self.released : end], end
        return delta, self.finish, None


def _show(result: Any) -> str:
    if isinstance(result, tuple | list) and len(result) == 3:
        delta, finish, message = result
        shown = f"AbortRequest({message.request_id!r})" if isinstance(message, AbortRequest) else repr(message)
        return f"({delta!r}, {finish!r}, {shown})"
    return repr(result)


def _same(got: Any, want: tuple) -> bool:
    if not isinstance(got, tuple | list) or len(got) != 3:
        return False
    (delta, finish, message), (want_delta, want_finish, want_message) = got, want
    if want_message is None:
        same_message = message is None
    else:
        same_message = isinstance(message, AbortRequest) and message.request_id == want_message.request_id
    return delta == want_delta and finish == want_finish and same_message


def _tokens(ids: Sequence[int]) -> str:
    """Token ids and what they are, for a FAIL line: [82, 265] = 'R' + 'OMEO'."""
    pieces = " + ".join(repr(VOCAB[t].decode()) if _whole(VOCAB[t]) else str(VOCAB[t]) for t in ids)
    return f"{list(ids)} = {pieces}" if ids else "[]"


def _whole(piece: bytes) -> bool:
    try:
        piece.decode()
        return True
    except UnicodeDecodeError:
        return False


def run_request(impl: Callable, stop: Sequence[str], steps: Sequence[tuple[Sequence[int], str | None]], why: str,
                request_id: str = "req-7", decoder: CountingDecode | None = None, show_from: int = 0) -> None:
    """Feed `steps` (tokens, the core's finish reason) one call each; every return must be the reference's.
    `show_from`: the FAIL line shows the calls from this one on (a long request's earlier calls: '...')."""
    decoder = decoder or CountingDecode()
    given = f"OutputProcessor({request_id!r}, decode, stop={list(stop)!r})"
    impl_object = call(given, "an OutputProcessor", impl, request_id, decoder, list(stop))
    reference = Reference(request_id, stop)
    for i, (ids, finish) in enumerate(steps):
        want = reference.process(ids, finish)
        if i == show_from and i > 0:
            given += ", ..."
        if i >= show_from:
            given += f", process({_tokens(ids)}, {finish!r})"
        got = call(given, _show(want), impl_object.process, list(ids), finish)
        expect(_same(got, want), given, f"{_show(want)} (this call: {_rule(reference, want)}; the case: {why})",
               _show(got))


def _rule(reference: Reference, want: tuple) -> str:
    """The rule that decides this call's answer, in words, from the reference's state after it."""
    delta, finish, _ = want
    if finish == "stop" and delta is not None and reference.released == len(reference.text) and want[2] is not None:
        return "a stop string appeared: the text up to it goes out, the core is told to stop"
    if finish is not None:
        return "the request has ended: whatever was held back goes out now" if delta else "the request has ended"
    held = reference.text[reference.released :]
    if held:
        return (f"{held!r} is held back — the longest end of the text that could still begin one of "
                f"{reference.stop!r} — and no more")
    if reference.pending:
        return "a character is not complete yet: its first bytes wait for the rest"
    return "no stop string begins with any end of the text: everything goes out"


def pieces(*texts: str) -> list[list[int]]:
    return [encode(t) for t in texts]


@processor.case
def the_deltas_add_up_to_the_text(impl: Callable) -> None:
    """Without stop strings, every complete character is released at once and the deltas add up to the text"""
    ids = encode("Hello there, the king is coming.")
    cuts = [0, 1, 4, 4, 6, 11, len(ids)]
    steps = [(ids[a:b], None) for a, b in zip(cuts, cuts[1:])] + [([], "length")]
    run_request(impl, [], steps, "no stop string: nothing is held back")


@processor.case
def a_character_split_across_tokens_waits_for_its_last_piece(impl: Callable) -> None:
    """A token that ends inside a character is released only once the character is complete"""
    steps = [([t], None) for t in encode("Café 🙂 ok")] + [([], "length")]
    run_request(impl, [], steps, "'é' is two tokens and '🙂' two: half a character is not text yet")


@processor.case
def the_work_per_token_stays_bounded(impl: Callable) -> None:
    """decode is given a few ids per token, not the whole output again at every step"""
    text = ("And the king said: the night is long, and the morning far; café, café! " * 6)[:400]
    ids = encode(text)
    decoder = CountingDecode()
    given = f"OutputProcessor('req-7', decode, stop=[]), then process([token], None) for each of {len(ids)} tokens"
    impl_object = call(given, "an OutputProcessor", impl, "req-7", decoder, [])
    for token in ids:
        call(given, "no error", impl_object.process, [token], None)
    limit = 16 * len(ids)
    expect(decoder.ids <= limit, given, f"decode given at most {limit:,} ids in all (16 per token: the tokens not "
           "yet decoded, maybe with a few of context)", f"{decoder.ids:,} ids, {decoder.ids / len(ids):.0f} per token "
           "and growing with the text — is the whole output decoded again at every step?")


@processor.case
def a_stop_string_ends_the_request(impl: Callable) -> None:
    """A stop string ends the request: the text before it, finish 'stop', and AbortRequest for the core"""
    steps = [(ids, None) for ids in pieces("ROMEO: speak", ", and then END", " of it all")]
    run_request(impl, ["END"], steps, "cut before 'END', the core told to stop")


@processor.case
def a_stop_string_across_calls_is_found(impl: Callable) -> None:
    """A stop string split across tokens and across calls is found"""
    steps = [(ids, None) for ids in pieces("It is t", "he e", "nd, my friend")]
    run_request(impl, ["the end"], steps, "'the end' begins in one call's tokens and ends in the next one's")
    steps = [([t], None) for t in encode("so ROMEO left")]
    run_request(impl, ["MEO l"], steps, "one token per call")


@processor.case
def text_that_may_become_a_stop_string_is_held_back(impl: Callable) -> None:
    """Text that could still become a stop string is held back, and released once it cannot"""
    steps = [(ids, None) for ids in pieces("Ah, RO", "M", "ANCE is here")] + [([], "length")]
    run_request(impl, ["ROMEO"], steps, "'RO' and 'ROM' could begin 'ROMEO'; 'ROMA' cannot")


@processor.case
def only_what_may_become_a_stop_string_is_held_back(impl: Callable) -> None:
    """Only the longest end of the text that a stop string begins with is held back, no more"""
    run_request(impl, ["<END>"], [(encode("hello there"), None)], "no stop string begins with any end of it")
    run_request(impl, ["abcab"], [(ids, None) for ids in pieces("xxabca", "b", "cc")],
                "'abca' could begin 'abcab' ('ca' and 'bca' could not); then 'abcab' is complete")
    run_request(impl, ["aab"], [(ids, None) for ids in pieces("aaa", "c")], "of 'aaa' only 'aa' could begin 'aab'")


@processor.case
def the_cores_end_releases_what_was_held(impl: Callable) -> None:
    """When the core ends the request, everything held back is released, with its reason and no message"""
    run_request(impl, ["ROMEO"], [(encode("I am R"), None), (encode("OM"), "length")], "the core's end: 'ROM' too")
    run_request(impl, [], [(encode("ok "), None), (encode("🙂")[:1], "stop")],
                "an end of text inside a character: its piece as decode gives it")


@processor.case
def after_the_end_nothing_more(impl: Callable) -> None:
    """After the end, later tokens are dropped: ('', its finish reason, None)"""
    run_request(impl, ["END"], [(encode("and END"), None), (encode(" more"), None), ([], "length")],
                "tokens the core made before it heard of the stop")
    run_request(impl, [], [(encode("all"), "length"), (encode(" more"), None)], "the core had ended it")


@processor.case
def the_earliest_stop_string_wins(impl: Callable) -> None:
    """Of several stop strings, the one that starts first in the text ends the request"""
    run_request(impl, ["world", "lo w"], [(encode("hello world"), None)], "'lo w' starts before 'world'")


@processor.case
def random_requests_match_the_rules(impl: Callable) -> None:
    """Random requests, stop strings and steps: every call as the rules give it"""
    rng = random.Random(10)
    alphabet = list("abcde ROMEND") + ["é", "🙂", "the", "ing"]
    for n in range(30):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 40)))
        ids = encode(text)
        stop = [text[(i := rng.randrange(len(text))) : i + rng.randint(1, 4)] if rng.random() < 0.6
                else "".join(rng.choice("abcde") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(0, 2))]
        stop = [s for s in stop if s]
        cuts = sorted({0, len(ids), *(rng.randrange(len(ids) + 1) for _ in range(rng.randint(1, 6)))})
        steps = [(ids[a:b], None) for a, b in zip(cuts, cuts[1:])]
        steps[-1] = (steps[-1][0], rng.choice(["length", "stop"]))
        run_request(impl, stop, steps, "as the rules give it", request_id=f"rand-{n}")


# ----------------------------------------------------------------------------- ch10.front_ends


def _processes(step_ms, per_token, per_request, output_tokens, slots, cores) -> int | None:
    work = slots * per_token + slots / output_tokens * per_request
    needed = max(1, math.ceil(work / step_ms - 1e-9))
    return needed if needed <= cores - 1 else None


def _ask(impl: Callable, why: str, step_ms: float, per_token: float, per_request: float, output_tokens: int,
         slots: int, cores: int) -> None:
    given = (f"front_end_processes(step_ms={step_ms}, front_ms_per_token={per_token}, front_ms_per_request="
             f"{per_request}, output_tokens={output_tokens}, max_num_seqs={slots}, cores={cores})")
    want = _processes(step_ms, per_token, per_request, output_tokens, slots, cores)
    work = slots * per_token + slots / output_tokens * per_request
    expected = f"{want} ({why}; the front end's work per step: {work:.4g} ms)"
    got = call(given, expected, impl, step_ms, per_token, per_request, output_tokens, slots, cores)
    expect(got == want and (got is None or isinstance(got, int)), given, expected, repr(got))


@front_ends.case
def the_example(impl: Callable) -> None:
    """The notebook's example: 17.92 ms of work per 10 ms step needs 2 processes"""
    _ask(impl, "8.96 ms each", 10, 0.05, 2, 100, 256, 8)


@front_ends.case
def each_requests_own_work_counts_once(impl: Callable) -> None:
    """A request's own work counts once per request: max_num_seqs / output_tokens requests end per step"""
    _ask(impl, "with the requests' own work, a second process", 8, 0.01, 3, 20, 64, 16)
    _ask(impl, "64 / 500 requests end per step, not 64", 8, 0.1, 10, 500, 64, 16)


@front_ends.case
def the_engine_core_keeps_a_core(impl: Callable) -> None:
    """The engine core keeps a core of its own: at most cores - 1 front ends, else None"""
    _ask(impl, "3 needed, 2 cores left", 5, 0.05, 1, 128, 256, 3)
    _ask(impl, "no core left for a front end", 5, 0.001, 0.1, 128, 8, 1)
    _ask(impl, "3 needed, 3 cores left", 5, 0.05, 1, 128, 256, 4)


@front_ends.case
def keeping_up_exactly_is_enough(impl: Callable) -> None:
    """A front end whose work fills exactly a step keeps up"""
    _ask(impl, "exactly 2 steps of work", 4, 0.03125, 0, 100, 256, 8)
    _ask(impl, "exactly one step of work", 6.4, 0.05, 0, 10, 128, 2)


@front_ends.case
def at_least_one_front_end(impl: Callable) -> None:
    """However light the work, one front end is needed"""
    _ask(impl, "a tiny share of a step", 20, 0.001, 0.01, 200, 4, 2)


@front_ends.case
def random_servers(impl: Callable) -> None:
    """Random servers: the fewest processes that keep up, as the rule gives it"""
    rng = random.Random(11)
    for _ in range(40):
        _ask(impl, "as the rule gives it", round(rng.uniform(2, 40), 2), round(rng.uniform(0.005, 0.2), 3),
             round(rng.uniform(0, 5), 2), rng.randint(8, 1000), rng.choice([8, 16, 64, 256, 512]), rng.randint(1, 32))
