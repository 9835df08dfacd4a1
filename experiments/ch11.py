"""Chapter 11's experiments: structured outputs on the shipped model and tokenizer.

    Automaton, speaker_automaton   a small regular expression as a finite automaton, built by hand
    allowed_by_hand                the tokens of the real vocabulary that automaton allows from a state:
                                   every character of a token walked, none may fall off the table
    library_allowed, compare_masks xgrammar's mask for the same regex, unpacked, and the two compared
    replay                         a real constrained run stepped through again with a fresh matcher: the
                                   mask at every step, the model's probabilities with and without it, and
                                   where the grammar stands (the data of widgets/grammar_replay.py)
    json_position                  where a piece of JSON text stands: the path, the open brackets, what next
    mask_cost                      what the grammar's work costs a decode step, at batch 1 and 16, live:
                                   interleaved rounds, with the busy-machine guard (minillm/timing.py)
    jump_forward_runs              the same requests with and without jump-forward: tokens per forward pass
    saved_results, saved_words     benchmarks/results/structured_outputs.json, when it exists

The mask at a step is a function of the tokens before it, so re-walking a fresh matcher over a run's
output fills exactly the masks the engine applied (`replay`); nothing in minillm/ records them.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments import Finding
from minillm.attention import DenseAttention
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.timing import PairedRatio, Trials, interleaved

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

REGEX = r"(ROMEO|JULIET): [a-z ]+\."  # section 1's regex: a speaker, then one line in lower case
NAMES = ("ROMEO", "JULIET")

# section 1's request: a tool call, as an agent's model would be asked for one
TOOL_CALL = {"type": "object", "properties": {
    "tool": {"const": "summon"},
    "arguments": {"type": "object", "properties": {
        "character": {"enum": ["ROMEO", "JULIET", "TYBALT", "NURSE"]},
        "scene": {"type": "integer", "minimum": 1, "maximum": 5},
        "greeting": {"type": "string", "maxLength": 24}},
        "required": ["character", "scene", "greeting"], "additionalProperties": False}},
    "required": ["tool", "arguments"], "additionalProperties": False}
TOOL_PROMPT = ('You are an agent. Call the tool "summon" with a character, a scene and a greeting. '
               "Answer in JSON only:\n")

# section 5's schema: a list no run of these lengths can finish, so that every step of a run is masked
LONG_LIST = {"type": "array", "minItems": 30,
             "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                        "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                        "role": {"enum": ["king", "queen", "fool", "knight"]}},
                       "required": ["name", "age", "role"], "additionalProperties": False}}
LIST_PROMPT = "The court of KING RICHARD, as a JSON list of records:"

# section 4's schema: long keys and an enum, text the grammar forces for many tokens at a time
RECORD = {"type": "object", "properties": {"character_name": {"type": "string", "maxLength": 10},
                                          "years_of_age": {"type": "integer", "minimum": 0, "maximum": 120},
                                          "disposition": {"enum": ["melancholy", "choleric", "sanguine"]}},
          "required": ["character_name", "years_of_age", "disposition"], "additionalProperties": False}
RECORD_PROMPTS = ("ROMEO:", "JULIET:", "KING RICHARD III:\nNow is the winter", "First Citizen:")

MASK_SHARE_CLAIM = 0.10  # section 5's claim: the grammar's work stays under a tenth of a decode step


# --------------------------------------------------------------------------------------------- by hand

@dataclass(frozen=True)
class Automaton:
    """A deterministic finite automaton over characters: `transitions[state][character]` is the next
    state; a character a state has no entry for leads nowhere (the text can no longer match)."""

    transitions: dict[int, dict[str, int]]
    start: int
    accepting: frozenset[int]
    labels: dict[int, str]  # a readable name per state, for the tables

    def walk(self, state: int | None, text: str) -> int | None:
        """The state after reading `text` from `state`, or None as soon as a character has no move."""
        for character in text:
            if state is None:
                return None
            state = self.transitions.get(state, {}).get(character)
        return state


def speaker_automaton(names: Sequence[str] = NAMES) -> Automaton:
    """REGEX, `(ROMEO|JULIET): [a-z ]+\\.`, as an automaton built by hand: the names as a tree of their
    prefixes (a state per prefix), every complete name leading to one state, then ':', ' ', one or more
    of [a-z ], and '.', after which the text is complete."""
    transitions: dict[int, dict[str, int]] = {0: {}}
    labels = {0: "start"}
    named = 1  # the state after a whole name: ROMEO and JULIET lead to the same future
    transitions[named], labels[named] = {}, "|".join(names)
    prefix_state: dict[str, int] = {"": 0}
    for name in names:
        for i, character in enumerate(name):
            before, now = name[:i], name[: i + 1]
            if now in prefix_state:
                continue
            state = named if now == name else len(transitions)
            if state != named:
                transitions[state], labels[state] = {}, now
            prefix_state[now] = state
            transitions[prefix_state[before]][character] = state
    colon, space, words, done = (len(transitions) + i for i in range(4))
    labels |= {colon: "name:", space: "name: ", words: "name: words", done: "name: words."}
    letters = "abcdefghijklmnopqrstuvwxyz "
    transitions[named] = {":": colon}
    transitions[colon] = {" ": space}
    transitions[space] = dict.fromkeys(letters, words)  # at least one of [a-z ]
    transitions[words] = {**dict.fromkeys(letters, words), ".": done}
    transitions[done] = {}
    # numbered in the order a walk first meets them (breadth first), for the tables
    order, queue = [0], [0]
    while queue:
        for target in transitions[queue.pop(0)].values():
            if target not in order:
                order.append(target)
                queue.append(target)
    new = {old: i for i, old in enumerate(order)}
    return Automaton({new[s]: {c: new[t] for c, t in moves.items()} for s, moves in transitions.items()}, 0,
                     frozenset({new[done]}), {new[s]: label for s, label in labels.items()})


def vocabulary(tokenizer, vocab_size: int) -> list[str]:
    """Every token's text, decoded alone (a piece of a character decodes to '\\ufffd')."""
    return [tokenizer.decode([t]) for t in range(vocab_size)]


def allowed_by_hand(automaton: Automaton, state: int, vocab: Sequence[str], eos_token_id: int) -> set[int]:
    """The tokens allowed next from `state`: those whose every character walks the automaton without
    falling off it, and the end-of-sequence token when `state` is accepting (the text is complete)."""
    allowed = {t for t, piece in enumerate(vocab)
               if t != eos_token_id and piece and automaton.walk(state, piece) is not None}
    if state in automaton.accepting:
        allowed.add(eos_token_id)
    return allowed


def unpack(row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One bitmask row, (ceil(vocab / 32),) int32, as (vocab,) booleans: bit t % 32 of word t // 32."""
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # (words, 32)
    return bits.flatten()[:vocab_size].bool()


def library_allowed(matcher, vocab_size: int) -> set[int]:
    """The tokens a matcher (minillm/structured/grammars.py::Matcher) allows next."""
    from minillm.structured.grammars import allocate_bitmask

    bitmask = allocate_bitmask(1, vocab_size)
    matcher.fill(bitmask, 0)
    return set(unpack(bitmask[0], vocab_size).nonzero().flatten().tolist())


@dataclass(frozen=True)
class MaskComparison:
    prefix: str
    state: str  # the hand-built automaton's state after the prefix
    by_hand: set[int]
    library: set[int]

    @property
    def agree(self) -> bool:
        return self.by_hand == self.library


def compare_masks(automaton: Automaton, tokenizer, grammar, vocab: Sequence[str], prefixes: Sequence[str],
                  eos_token_id: int) -> list[MaskComparison]:
    """For each prefix: the hand-built mask from the state the prefix leads to, and the library's mask
    after a fresh matcher accepted the prefix's tokens."""
    from minillm.structured.grammars import Matcher

    found = []
    for prefix in prefixes:
        state = automaton.walk(automaton.start, prefix)
        if state is None:
            raise ValueError(f"the prefix {prefix!r} does not match the automaton")
        matcher = Matcher(grammar)
        for token in tokenizer.encode(prefix, add_special_tokens=False):
            if not matcher.accept(token):
                raise ValueError(f"the library refused token {token} of the prefix {prefix!r}")
        found.append(MaskComparison(prefix, automaton.labels[state], allowed_by_hand(automaton, state, vocab,
                                                                                       eos_token_id),
                                    library_allowed(matcher, len(vocab))))
    return found


# ------------------------------------------------------------------------------------------- where JSON stands

def json_position(text: str) -> tuple[str, str, str]:
    """Where a prefix of compact JSON text stands: (path, open brackets, what may come next), e.g.
    ('$.arguments.character', '{ {', 'inside a string value'). A scanner of the text itself — the
    grammar library does not expose its stack — good for the JSON the course's schemas produce."""
    stack: list[list] = []  # per open container: ["{", key or None, expecting] / ["[", index, expecting]
    in_string = escaped = False
    string_is_key = False
    key_chars: list[str] = []
    in_number = False
    done = False

    def path() -> str:
        parts = "$"
        for kind, where, _ in stack:
            if kind == "{" and where is not None:
                parts += f".{where}"
            elif kind == "[":
                parts += f"[{where}]"
        return parts

    def value_done() -> None:
        nonlocal done
        if stack:
            stack[-1][2] = "comma"
        else:
            done = True

    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if string_is_key:
                    stack[-1][1] = "".join(key_chars)
                    stack[-1][2] = "colon"
                else:
                    value_done()
            elif string_is_key:
                key_chars.append(ch)
            continue
        if in_number:  # a number, or true / false / null
            if ch.isalnum() or ch in "+-.":
                continue
            in_number = False
            value_done()
        if ch in " \n\t":
            continue
        top = stack[-1] if stack else None
        if ch == '"':
            in_string = True
            string_is_key = top is not None and top[0] == "{" and top[2] == "key"
            key_chars = []
        elif ch in "{[":
            if top is not None and top[0] == "[":
                top[2] = "value"
            stack.append([ch, None if ch == "{" else 0, "key" if ch == "{" else "value"])
        elif ch in "}]":
            if stack:
                stack.pop()
            value_done()
        elif ch == ":" and top is not None:
            top[2] = "value"
        elif ch == "," and top is not None:
            if top[0] == "{":
                top[1], top[2] = None, "key"
            else:
                top[1], top[2] = top[1] + 1, "value"
        elif ch.isalnum() or ch == "-":
            in_number = True
    brackets = " ".join(kind for kind, _, _ in stack)
    if done:
        return "$", "", "the JSON value is complete"
    if in_string:
        what = "inside a key" if string_is_key else "inside a string value"
        return path() + (f".{''.join(key_chars)}…" if string_is_key else ""), brackets, what
    if in_number:
        return path(), brackets, "inside a number or a literal (more of it, or what follows it)"
    if not stack:
        return "$", "", "before the first character: a value must start"
    kind, where, expecting = stack[-1]
    what = {("{", "key"): "a key (or the closing brace) next", ("{", "colon"): f"the colon after \"{where}\" next",
            ("{", "value"): f"the value of \"{where}\" next", ("{", "comma"): "a comma or the closing brace next",
            ("[", "value"): "an element (or the closing bracket) next",
            ("[", "comma"): "a comma or the closing bracket next"}[(kind, expecting)]
    return path(), brackets, what


# ---------------------------------------------------------------------------------------------- the replay

@dataclass(frozen=True)
class ReplayStep:
    """One step of a constrained run, as the engine masked it."""

    token: int
    piece: str  # its text
    text: str  # the output's text before it
    allowed: int  # how many tokens the mask allowed
    top: tuple[tuple[str, float], ...]  # the most likely allowed tokens: text, probability after the mask
    wanted: tuple[str, float]  # the model's favourite without the mask, and its probability
    kept_mass: float  # the probability the model (unmasked) gave to the tokens the mask allowed
    chosen_p: float  # the chosen token's probability after the mask
    where: tuple[str, str, str]  # json_position of `text` (path, open brackets, what next)
    forced: str  # the text the grammar forces from here (what jump-forward would append), maybe ""

    def to_dict(self) -> dict:
        return {"token": self.token, "piece": self.piece, "text": self.text, "allowed": self.allowed,
                "top": [list(t) for t in self.top], "wanted": list(self.wanted), "kept_mass": self.kept_mass,
                "chosen_p": self.chosen_p, "where": list(self.where), "forced": self.forced}


def _position(text: str, allowed: int, piece: str) -> tuple[str, str, str]:
    """json_position of `text`, its "what next" made exact where the mask is: a JSON reader knows what JSON
    allows next, the schema often allows less — where it leaves one token, that token is named."""
    path, brackets, what = json_position(text)
    if allowed == 1:
        what = f"only {piece!r} next: the schema allows nothing else"
    return path, brackets, what


def _piece(tokenizer, token: int, eos_token_ids: Sequence[int]) -> str:
    return "<end of text>" if token in eos_token_ids else tokenizer.decode([token])


@torch.inference_mode()
def replay(model, tokenizer, grammar, prompt_ids: Sequence[int], output_ids: Sequence[int],
           top: int = 4) -> list[ReplayStep]:
    """Every step of a finished constrained run again: a fresh matcher walks the output token by token,
    filling the mask before each (exactly the mask the engine applied: it depends on the tokens before
    it only), and one forward pass over the whole sequence gives the model's logits at every step."""
    from minillm.structured.grammars import Matcher, allocate_bitmask

    vocab_size = model.config.vocab_size
    eos = tuple(model.config.eos_token_ids)
    sequence = torch.tensor(list(prompt_ids) + list(output_ids[:-1]), device=model.device)
    hidden = model(sequence, torch.arange(len(sequence), device=model.device), DenseAttention([len(sequence)]))
    logits = model.logits(hidden[len(prompt_ids) - 1:]).cpu()  # (len(output), vocab): the logits before each token
    matcher, bitmask = Matcher(grammar), allocate_bitmask(1, vocab_size)
    steps, text = [], ""
    for i, token in enumerate(output_ids):
        matcher.fill(bitmask, 0)
        allowed = unpack(bitmask[0], vocab_size)
        probs = logits[i].softmax(-1)
        masked = logits[i].masked_fill(~allowed, float("-inf")).softmax(-1)
        best = masked.topk(min(top, int(allowed.sum()))).indices.tolist()
        wanted = int(probs.argmax())
        steps.append(ReplayStep(token, _piece(tokenizer, token, eos), text, int(allowed.sum()),
                                tuple((_piece(tokenizer, t, eos), float(masked[t])) for t in best),
                                (_piece(tokenizer, wanted, eos), float(probs[wanted])),
                                float(probs[allowed].sum()), float(masked[token]),
                                _position(text, int(allowed.sum()), _piece(tokenizer, token, eos)),
                                matcher.jump_forward()))
        if not matcher.accept(token):
            raise ValueError(f"step {i}: the grammar refuses token {token} — is this the run's own grammar?")
        text += "" if token in eos else tokenizer.decode([token])
    return steps


# ------------------------------------------------------------------------------------------- mask's cost

@dataclass(frozen=True)
class RunTimes:
    """One run of `batch` requests decoding: the median all-decode step, and per step the grammar's work."""

    batch: int
    step_ms: float
    fill_ms: float  # the step's bitmask filled, a row per request (0 when nothing was constrained)
    apply_ms: float  # the bitmask applied to the logits
    advance_ms: float  # the matchers following the kept tokens, per step
    tokens: int

    @property
    def grammar_ms(self) -> float:
        return self.fill_ms + self.apply_ms + self.advance_ms


class GrammarTimer:
    """Times the grammar's three pieces of work inside a real engine's steps, by wrapping the engine's
    own methods on these objects for the duration of a `with` block (minillm/ is left as it is):
    ModelRunner._masks (allocate and fill the step's bitmask), StepMasks.apply (on the logits), and
    StructuredOutputManager.advance (a matcher accepts a kept token)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.fill: list[float] = []
        self.apply: list[float] = []
        self.advance: list[float] = []

    def __enter__(self) -> GrammarTimer:
        runner, structured = self.engine.runner, self.engine.structured
        fill, advance = runner._masks, structured.advance

        def timed_masks(*args):
            start = time.perf_counter()
            masks = fill(*args)
            self.fill.append(time.perf_counter() - start)
            if masks is not None:
                apply = masks.apply

                def timed_apply(logits):
                    begin = time.perf_counter()
                    apply(logits)
                    self.apply.append(time.perf_counter() - begin)

                masks.apply = timed_apply
            return masks

        def timed_advance(request, token_id):
            start = time.perf_counter()
            advance(request, token_id)
            self.advance.append(time.perf_counter() - start)

        runner._masks, structured.advance = timed_masks, timed_advance
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.runner._masks, self.engine.structured.advance  # the class's methods again


def decode_run(engine: LLMEngine, prompt_ids: Sequence[int], batch: int, tokens: int,
               structured: dict | None) -> RunTimes:
    """`batch` copies of the prompt, `tokens` greedy tokens each (every request runs all of them: unconstrained,
    the end-of-text token is ignored; constrained, the schema cannot be complete within `tokens`)."""
    params = SamplingParams(temperature=0, max_new_tokens=tokens, ignore_eos=structured is None, structured=structured)
    first = engine.trace.next_step
    with GrammarTimer(engine) as timer:
        ids = [engine.add_request(list(prompt_ids), params).request_id for _ in range(batch)]
        while engine.has_unfinished():
            engine.step()
    outputs = [engine.output(i) for i in ids]
    for i in ids:
        engine.release(i)
    if any(o.finish_reason != "length" for o in outputs):
        raise RuntimeError(f"a run ended early: {[o.finish_reason for o in outputs]}")
    steps = [s.duration for s in engine.trace.steps if s.step >= first and s.decode_tokens == batch
             and s.num_tokens == batch]
    per_step = len(steps) or 1
    masked = structured is not None
    return RunTimes(batch, statistics.median(steps) * 1e3,
                    statistics.median(timer.fill) * 1e3 if masked and timer.fill else 0.0,
                    statistics.median(timer.apply) * 1e3 if timer.apply else 0.0,
                    sum(timer.advance) / per_step * 1e3 if masked else 0.0,
                    sum(len(o.token_ids) for o in outputs))


class MaskCost(Finding):
    """mask_cost's finding: `show()` prints the guard's warning (when it fired), the table, then the words."""

    def table(self) -> str:
        rows = []
        for batch, n in self.numbers["batches"].items():
            rows.append([str(batch), f"{n['free_ms']:.2f} ms", f"{n['masked_ms']:.2f} ms",
                         f"{n['step_ratio'].value:.2f}x", f"{n['fill_ms']:.3f} ms", f"{n['apply_ms']:.3f} ms",
                         f"{n['advance_ms']:.3f} ms", f"{n['share'].value:.1%}"])
        return _table(["batch", "step, free", "step, masked", "masked / free", "fill the bitmask", "apply it",
                       "matchers follow", "grammar / free step"], rows, "rrrrrrrr")

    def show(self) -> None:
        import textwrap

        if self.warning:
            print(textwrap.fill(self.warning, 100) + "\n")
        print(self.table())
        print(textwrap.fill("(The two step columns: the median round, the one whose masked / free ratio is the "
                            "median of the rounds'. The grammar's columns: medians.)", 100) + "\n")
        for paragraph in self.text.split("\n"):
            print(textwrap.fill(paragraph, 100) if paragraph.strip() else "")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    cells = [list(headers), *map(list, rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(row, widths, align)).rstrip()
             for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def mask_cost(engine: LLMEngine, prompt_ids: Sequence[int], batches: Sequence[int] = (1, 16), tokens: int = 24,
              rounds: int = 3, schema: dict = LONG_LIST, rerun: str = "this cell") -> MaskCost:
    """Decode steps free and under `schema` (every step masked: the schema cannot finish in `tokens`), at
    each batch size, interleaved over `rounds` after a warm-up (the grammar compiles there)."""
    runs: dict[str, Callable[[], RunTimes]] = {}
    for batch in batches:
        runs[f"free {batch}"] = lambda b=batch: decode_run(engine, prompt_ids, b, tokens, None)
        runs[f"masked {batch}"] = lambda b=batch: decode_run(engine, prompt_ids, b, tokens, {"json": schema})
    trials = interleaved(runs, rounds, warmup=True, rerun=rerun)
    return describe_mask_cost(trials, batches)


def describe_mask_cost(trials: Trials, batches: Sequence[int]) -> MaskCost:
    """The words for mask_cost's trials. The claim the guard checks: the grammar's work (fill, apply,
    follow) under MASK_SHARE_CLAIM of the unconstrained step, in every round; the step's own ratio is
    reported, not judged (its rounds may sit either side of 1: the mask is a small part of a step)."""
    numbers: dict[int, dict[str, Any]] = {}
    for batch in batches:
        free, masked = trials.results[f"free {batch}"], trials.results[f"masked {batch}"]
        share = PairedRatio(f"grammar {batch}", f"free {batch}",
                            tuple(m.grammar_ms / f.step_ms for m, f in zip(masked, free)),
                            f"the grammar's work at batch {batch} against the step", MASK_SHARE_CLAIM)
        trials.checked.append(share)
        ratios = [m.step_ms / f.step_ms for m, f in zip(masked, free)]
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]  # the median round
        numbers[batch] = {
            "free_ms": free[middle].step_ms,  # the median round's two steps: their ratio is the one shown
            "masked_ms": masked[middle].step_ms,
            "step_ratio": PairedRatio(f"masked {batch}", f"free {batch}", tuple(ratios)),
            "fill_ms": statistics.median(r.fill_ms for r in masked),
            "apply_ms": statistics.median(r.apply_ms for r in masked),
            "advance_ms": statistics.median(r.advance_ms for r in masked),
            "grammar_ms": masked[middle].grammar_ms,
            "share": share}
    small, large = min(batches), max(batches)
    a, b = numbers[small], numbers[large]
    per_row = (b["fill_ms"] - a["fill_ms"]) / (large - small) if large > small else a["fill_ms"]
    fixed = max(a["fill_ms"] - per_row * small, 0.0)
    holds = all(n["share"].value < MASK_SHARE_CLAIM for n in numbers.values())
    busy = trials.warning() is not None
    lines = []
    for batch, n in numbers.items():
        lines.append(f"At batch {batch}, a decode step took {n['free_ms']:.2f} ms free and {n['masked_ms']:.2f} ms "
                     f"under the schema in the median round ({n['step_ratio'].value:.2f}x; round by round "
                     f"{n['step_ratio'].rounds()}). The grammar's own work per step — filling the bitmask "
                     f"{n['fill_ms']:.3f} ms, applying it {n['apply_ms']:.3f} ms, the matchers following the kept "
                     f"tokens {n['advance_ms']:.3f} ms — came to {n['share'].value:.1%} of the free step (rounds: "
                     f"{n['share'].rounds('{:.1%}')}).")
    text = " ".join(lines) + "\n"
    if holds:
        text += (f"So the mask costs a few percent of a step here, not a tenth. Filling grows with the rows: about "
                 f"{per_row * 1e3:.1f} µs per request on top of {fixed * 1e3:.0f} µs per step (allocating the "
                 "bitmask, calling into the library), while the step itself grows more slowly than its rows — so "
                 "the grammar's share changes little from batch 1 to batch 16 on this CPU. ")
    else:
        text += (f"Here the grammar's work did not stay under {MASK_SHARE_CLAIM:.0%} of a step in every round: on a "
                 "quiet machine it takes a few percent. ")
    if busy:
        text += ("Other programs were running meanwhile (the warning above), so the two step times can differ by "
                 "far more than the mask costs, either way: the grammar's own work, timed inside the step, is the "
                 "steadier figure. Rerun this cell on a quiet machine to compare the steps themselves.")
    else:
        # what the masked step took beyond the free one and the grammar's measured work (the median round)
        unseen = {batch: n["masked_ms"] - n["free_ms"] - n["grammar_ms"] for batch, n in numbers.items()}
        beyond = [b for b, ms in unseen.items() if ms > 0.02 and numbers[b]["step_ratio"].value > 1]
        if beyond:
            text += ("In the median round the masked step was slower than the free one by more than the grammar's "
                     "own work (" + ", ".join(f"{unseen[b]:.2f} ms more at batch {b}" for b in beyond) + "): the "
                     "rest is work the three timers do not isolate — the logits copied before masking, so that "
                     "logprobs can still read the raw ones; each matcher asked whether its grammar is complete — "
                     "and the runs' own noise (the two runs decode different tokens, moments apart).")
        else:
            text += ("The masked step was slower than the free one by no more than the grammar's own work: what is "
                     "left is the runs' noise.")
    return MaskCost(text, holds, {"batches": numbers, "fill_per_row_ms": per_row, "fill_fixed_ms": fixed}, trials)


def handoff_ms(rounds: int = 200) -> float:
    """What handing one small task to a pool thread and waiting for it costs here (the median, ms)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(int).result()  # the thread started
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            pool.submit(int).result()
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


# ------------------------------------------------------------------------------------------ jump-forward

@dataclass(frozen=True)
class JumpRun:
    """One engine's run of the same requests: each request's tokens and forward passes, and the texts."""

    way: str
    token_ids: list[list[int]]
    texts: list[str]
    passes: list[int]  # forward passes each request took part in (from the trace)
    forced: int  # tokens jump-forward appended unsampled

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / max(sum(self.passes), 1)


def jump_run(engine: LLMEngine, prompts: Sequence[str], schema: dict, max_new_tokens: int = 128) -> JumpRun:
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, structured={"json": schema})
    first, forced = engine.trace.next_step, engine.jump_forward_tokens
    ids = [engine.add_request(p, params).request_id for p in prompts]
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.output(i) for i in ids]
    passes = [sum(1 for step in engine.trace.steps if step.step >= first for s in step.slots
                  if s is not None and s.request_id == i and s.num_tokens) for i in ids]
    for i in ids:
        engine.release(i)
    way = "jump-forward" if engine.config.jump_forward else "sampled"
    return JumpRun(way, [list(o.token_ids) for o in outputs], [o.text for o in outputs], passes,
                   engine.jump_forward_tokens - forced)


def jump_forward_runs(engines: dict[str, LLMEngine], prompts: Sequence[str] = RECORD_PROMPTS,
                      schema: dict = RECORD, rounds: int = 3) -> Finding:
    """The same greedy requests in an engine without and one with jump-forward, interleaved over `rounds`
    (after a warm-up): tokens per forward pass (counted, not timed) and the run's time (timed)."""
    runs = {way: (lambda e=engine: _timed(lambda: jump_run(e, prompts, schema))) for way, engine in engines.items()}
    trials = interleaved(runs, rounds, warmup=True, rerun="this cell")
    return describe_jump_forward(trials)


def _timed(run: Callable[[], JumpRun]) -> tuple[JumpRun, float]:
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def describe_jump_forward(trials: Trials) -> Finding:
    sampled, jumped = trials.results["sampled"][-1][0], trials.results["jump-forward"][-1][0]
    time_ratio = trials.ratio("jump-forward", "sampled", lambda r: r[1], what="the run's time")
    seconds = {way: statistics.median(r[1] for r in trials.results[way]) for way in trials.results}
    same = sum(a == b for a, b in zip(sampled.texts, jumped.texts))
    holds = jumped.tokens_per_pass > sampled.tokens_per_pass and time_ratio.value < 1
    text = (f"Without jump-forward every request produced exactly one token per forward pass "
            f"({sampled.tokens} tokens in {sum(sampled.passes)} request-passes, {sampled.tokens_per_pass:.2f} per "
            f"pass). With it, {jumped.forced} of {jumped.tokens} tokens were appended unsampled, and each pass "
            f"computed a forced run together with the next sampled token: {jumped.tokens_per_pass:.2f} tokens per "
            f"pass, {sum(jumped.passes)} request-passes in all. The run took {seconds['jump-forward'] * 1e3:.0f} ms "
            f"against {seconds['sampled'] * 1e3:.0f} ms ({time_ratio.value:.2f}x; rounds {time_ratio.rounds()}). ")
    text += (f"Both ways every output is valid; {same} of {len(sampled.texts)} texts are the same. "
             + ("They differ because the forced text was tokenized on its own, not as the model would have spelt "
                "it: from the first forced run on, the model continues a different token sequence (next cell)."
                if same < len(sampled.texts) else "Here the forced text happened to be spelt as the model spelt it."))
    return Finding(text, holds, {"sampled": sampled, "jump": jumped, "time_ratio": time_ratio, "seconds": seconds},
                   trials)


# ----------------------------------------------------------------------------------------- saved results

def saved_results(name: str = "structured_outputs.json") -> dict | None:
    """benchmarks/results/<name>, or None when the benchmark has not been run in this copy."""
    path = RESULTS / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:  # being written right now
        return None


def saved_rows(saved: dict) -> list[list[str]]:
    """One row per engine and batch: decode step free and masked (minillm), throughput free and masked.
    Each pair is the benchmark's median round — the round whose masked / free ratio is the median of the
    rounds' — so the ratio shown is the pair's own."""
    rows = []
    for engine in ("minillm", "vllm"):
        for batch, row in sorted(saved.get(engine, {}).items(), key=lambda kv: int(kv[0])):
            rounds = row.get("rounds", {})
            if engine == "minillm" and rounds:  # [step ms, tokens/s] per round
                free_step, masked_step = _median_round([(f[0], m[0]) for f, m in zip(rounds["free"], rounds["masked"])])
                free_rate, masked_rate = _median_round([(f[1], m[1]) for f, m in zip(rounds["free"], rounds["masked"])])
            elif rounds:  # tokens/s per round
                free_step = masked_step = None
                free_rate, masked_rate = _median_round(list(zip(rounds["free"], rounds["masked"])))
            else:
                free_step, masked_step = row.get("free_step_ms"), row.get("masked_step_ms")
                free_rate, masked_rate = row["free_tokens_per_s"], row["masked_tokens_per_s"]
            step = (f"{free_step:.2f} → {masked_step:.2f} ms ({masked_step / free_step:.2f}x)"
                    if free_step is not None and masked_step is not None else "—")
            rows.append([engine if engine == "minillm" else f"vLLM {saved.get('vllm_version') or ''}".strip(),
                         batch, step, f"{free_rate:,.0f} → {masked_rate:,.0f} tok/s",
                         f"{masked_rate / free_rate:.2f}x"])
    return rows


def _median_round(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The (free, masked) pair whose masked / free ratio is the median of the pairs'."""
    return sorted(pairs, key=lambda pair: pair[1] / pair[0])[(len(pairs) - 1) // 2]


def saved_words(saved: dict) -> str:
    """What the saved benchmark says, computed from whatever it holds."""
    words = []
    mine = saved.get("minillm", {})
    for batch, row in sorted(mine.items(), key=lambda kv: int(kv[0])):
        slower = (row["step_ratio"] - 1) * 100
        words.append(f"at batch {batch} the masked decode step took {row['step_ratio']:.2f}x the free one "
                     f"({'+' if slower >= 0 else ''}{slower:.0f}%)")
    text = (f"Saved on {saved.get('machine', 'an unnamed machine')}, {saved.get('rounds', '?')} interleaved rounds of "
            f"{saved.get('tokens', '?')} tokens per request: " + "; ".join(words) + ".") if words else ""
    spreads = []
    for batch, row in sorted(mine.items(), key=lambda kv: int(kv[0])):
        rounds = row.get("rounds", {})
        if rounds:
            ratios = [m[1] / f[1] for f, m in zip(rounds["free"], rounds["masked"])]
            spreads.append(f"{min(ratios):.2f}x to {max(ratios):.2f}x at batch {batch}")
    if spreads:
        text += (" Throughput counts a whole run — admission, prefill, the last steps of a shrinking batch — so its "
                 "rounds spread wider than the median step's: minillm's masked / free throughput ranged from "
                 + ", and from ".join(spreads) + ".")
    vllm = saved.get("vllm")
    if vllm:
        ratios = ", ".join(f"{r['throughput_ratio']:.2f}x at batch {b}" for b, r in sorted(vllm.items(),
                                                                                            key=lambda kv: int(kv[0])))
        text += (f" vLLM's throughput under the same schema, against its own unconstrained throughput: {ratios} "
                 "(vLLM fills its masks while the forward pass runs; on a CPU that forward pass uses the same cores).")
    jump = saved.get("jump_forward")
    if jump:
        text += (f" Jump-forward on 16 requests of a schema with long keys: {jump['sampled']['tokens_per_pass']:.2f} → "
                 f"{jump['jump']['tokens_per_pass']:.2f} output tokens per request-pass; the run took "
                 f"{jump['time_ratio']:.2f}x the time.")
    return text.strip()
