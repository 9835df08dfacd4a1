"""Structured outputs attacked as a hostile user would, at the engine level (LLM, LLMEngine, AsyncLLM, the
engine core process): every case here once found a defect. A bad constraint is a ValueError at the door that
names the problem; a grammar the engine cannot serve fails its own request alone; nothing hangs, crashes, leaks
or keeps growing; an output that ends with "stop" matches its constraint."""

import asyncio
import json
import pickle
import re
import threading

import jsonschema
import numpy as np
import pytest
import torch

import minillm
from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.structured import StructuredOutput
from minillm.structured.grammars import GrammarCompiler, allocate_bitmask, apply_bitmask

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def shipped():
    return minillm.load_model(), minillm.load_tokenizer()


def make_engine(shipped, **options) -> LLMEngine:
    model, tokenizer = shipped
    options = {"max_num_seqs": 6, "max_model_len": 512, "max_tokens_per_step": 256, "kv": "paged", **options}
    return LLMEngine(model, tokenizer, EngineConfig(**options))


def run(engine: LLMEngine, prompts, params, max_steps: int = 2000) -> list:
    ids = [engine.add_request(p, sp).request_id for p, sp in zip(prompts, params)]
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished(), "the engine did not finish its requests"
    outputs = [engine.output(i) for i in ids]
    for i in ids:
        engine.release(i)
    return outputs


def deep_schema(levels: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def shared_lists(width: int, levels: int) -> list:
    """A list held `width` times by its parent, `levels` deep: small in memory, width ** levels as JSON."""
    node: list = [1]
    for _ in range(levels):
        node = [node] * width
    return node


def self_holding() -> dict:
    schema: dict = {"type": "object"}
    schema["properties"] = {"me": schema}
    return schema


# ---------------------------------------------------------------------------------------- at the door
@pytest.mark.parametrize("fields, match", [
    ({"json": {"enum": {1, 2}}}, "a set is not a JSON value"),  # was a TypeError from json.dumps
    ({"json": {"type": "number", "minimum": float("nan")}}, "JSON values"),  # was compiled, then failed
    ({"json": {"type": "number", "maximum": float("inf")}}, "JSON values"),
    ({"json": {1: {"type": "integer"}, "1": {"type": "string"}}}, "keys must be strings"),  # two keys "1"
    ({"json": {None: 1}}, "keys must be strings"),
    ({"json": deep_schema(500)}, "nested more than 100"),  # was a RecursionError
    ({"json": json.dumps(deep_schema(500))}, "nested more than 100"),
    ({"json": "[" * 100_000 + "]" * 100_000}, "nested more than 100"),
    ({"json": {"enum": shared_lists(1000, 3)}}, "longer than 100,000"),  # would be 10**9 values as text
    ({"json": self_holding()}, "nested more than 100"),  # was a RecursionError (json.dumps: circular)
    ({"json": {"enum": ["\ud800"]}}, "surrogates"),  # was compiled, then failed
    ({"choice": ["\ud800"]}, "not valid Unicode"),
    ({"regex": "a\udfffb"}, "not valid Unicode"),
    ({"grammar": 'root ::= "\ud800"'}, "not valid Unicode"),
    ({"choice": {"a": 1, "b": 2}}, "list of non-empty strings"),  # was its keys
    ({"choice": (c for c in ["a", ""])}, "list of non-empty strings"),
])
def test_a_malformed_constraint_is_a_value_error_naming_it(fields, match):
    with pytest.raises(ValueError, match=match):
        StructuredOutput(**fields)
    with pytest.raises(ValueError, match=match):
        SamplingParams(structured=fields)


@pytest.mark.parametrize("fields, match", [
    ({"regex": "a", 5: 1}, "got 5"),  # was a TypeError from sorting the names
    ({1: 2}, "got 1"),
])
def test_structured_fields_that_are_not_names_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(structured=fields)


def test_ignore_eos_beside_a_structured_output_is_refused():
    """The grammar ends the output (once complete it allows only EOS), so ignore_eos would be silently ignored."""
    with pytest.raises(ValueError, match="ignore_eos cannot be combined with a structured output"):
        SamplingParams(ignore_eos=True, structured={"regex": "[0-9]+"})


def test_a_generator_of_choices_is_read_once_and_kept():
    """It was consumed by the check and then stored empty: a choice of nothing, compiled as such."""
    constraint = StructuredOutput(choice=(c for c in ["yes", "no"]))
    assert constraint.choice == ("yes", "no")
    assert StructuredOutput(choice=np.array(["yes", "no"])).choice == ("yes", "no")  # was "ambiguous truth value"


def test_a_schema_changed_after_the_constraint_was_made_does_not_change_it():
    """The constraint kept the caller's dict and computed its key later: a schema changed in between compiled as
    one thing and was cached (and shared) under another's key."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = StructuredOutput(json=schema)
    schema["properties"]["a"]["type"] = "string"
    assert constraint.json["properties"]["a"]["type"] == "integer"
    assert constraint == StructuredOutput(json={"type": "object", "properties": {"a": {"type": "integer"}},
                                                "required": ["a"]})


def test_numpy_values_in_a_schema_become_plain_json_and_cross_to_the_core():
    plain = StructuredOutput(json={"type": "integer", "minimum": 3, "maximum": 9, "uniqueItems": False})
    numpy = StructuredOutput(json={"type": "integer", "minimum": np.int64(3), "maximum": np.int32(9),
                                   "uniqueItems": np.False_})
    assert numpy == plain and hash(numpy) == hash(plain)
    assert type(numpy.json["minimum"]) is int
    params = SamplingParams(temperature=0, structured=numpy)
    assert pickle.loads(pickle.dumps(params)) == params  # what ProcessAsyncLLM sends its engine core


# ---------------------------------------------------------------------------------------- jump-forward
FOREVER = [{"grammar": 'root ::= "a" root'},  # no finite output: the forced text never ends
           {"json": {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
                     "$ref": "#/$defs/n"}}]


def test_jump_forward_on_text_forced_forever_ends_at_the_length_limit(shipped, monkeypatch):
    """xgrammar's find_jump_forward_string has no bound: on these grammars it filled memory until the engine's
    process was killed (std::bad_alloc under a limit). The forced text is now searched for a bounded length."""
    import xgrammar as xgr

    def unbounded(self):
        raise AssertionError("the library's unbounded jump-forward search was called")

    monkeypatch.setattr(xgr.GrammarMatcher, "find_jump_forward_string", unbounded)
    others = [("Give me the record as JSON:",
               SamplingParams(temperature=0, max_new_tokens=60, structured={"json": PERSON})),
              ("ROMEO:", SamplingParams(temperature=0, max_new_tokens=30))]
    expected = run(make_engine(shipped, jump_forward=True), [p for p, _ in others], [q for _, q in others])
    engine = make_engine(shipped, jump_forward=True)
    hostile = [SamplingParams(temperature=0.8, seed=1, max_new_tokens=n, structured=c)
               for n, c in zip((20, 30), FOREVER)]
    outputs = run(engine, ["a:", "b:"] + [p for p, _ in others], hostile + [q for _, q in others])
    for output, params in zip(outputs, hostile):
        assert output.finish_reason == "length" and len(output.token_ids) == params.max_new_tokens
    assert re.fullmatch("a+", outputs[0].text) and outputs[1].text.startswith('{"c": {"c": {"c": ')
    assert [o.token_ids for o in outputs[2:]] == [o.token_ids for o in expected]
    assert outputs[2].finish_reason == "stop"
    jsonschema.validate(json.loads(outputs[2].text), PERSON)
    assert engine.jump_forward_tokens >= 40


def test_the_bounded_jump_forward_finds_what_the_library_finds(shipped):
    """Where the library's search ends, the bounded one gives the same text, and leaves the matcher as it was."""
    model, tokenizer = shipped
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    constraints = [StructuredOutput(json=PERSON),
                   StructuredOutput(choice=["😀 yes", "😀 no", "日本語", "日本人", "é", "è"]),
                   StructuredOutput(json={"type": "array", "items": {"enum": ["alpha", "alphabet", "beta"]}}),
                   StructuredOutput(regex="(ab|cd)x{40}")]
    generator = torch.Generator().manual_seed(0)
    bitmask = allocate_bitmask(1, model.config.vocab_size)
    for constraint in constraints:
        matcher = compiler.matcher(compiler.compile(constraint))
        for _ in range(60):
            matcher.fill(bitmask, 0)
            before = bitmask.clone()
            assert matcher.jump_forward() == matcher._matcher.find_jump_forward_string()
            assert len(matcher.jump_forward(max_bytes=5).encode()) <= 5
            matcher.fill(bitmask, 0)
            assert torch.equal(bitmask, before)
            logits = torch.randn(1, model.config.vocab_size, generator=generator) * 3
            apply_bitmask(logits, bitmask)
            assert matcher.accept(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
            if matcher.is_finished:
                break
    compiler.close()


# ---------------------------------------------------------------------------------------- the compiler
class HeldCompiler(GrammarCompiler):
    """Compiles like the real one, but a regex starting with "held:" waits for `release` (a compilation that
    takes as long as the test wants)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.release = threading.Event()

    def _compile(self, constraint):
        if constraint.kind == "regex" and constraint.regex.startswith("held:"):
            assert self.release.wait(30)
        return super()._compile(constraint)


def held_engine(shipped, **options) -> tuple[LLMEngine, HeldCompiler]:
    model, tokenizer = shipped
    engine = make_engine(shipped, **options)
    engine.structured._compiler = HeldCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    return engine, engine.structured._compiler


def test_compiled_grammars_are_kept_for_the_latest_constraints_only(shipped, monkeypatch):
    """Every distinct constraint ever compiled was kept (tens of KB each here, far more with a real vocabulary):
    a client sending distinct schemas grew the engine's memory without bound."""
    from minillm.structured import grammars

    monkeypatch.setattr(grammars, "MAX_CACHED", 3)
    model, tokenizer = shipped
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    first = compiler.submit(StructuredOutput(regex="[0-9]{1}"))
    for n in range(2, 12):
        compiler.compile(StructuredOutput(regex=f"[0-9]{{{n}}}"))
        assert len(compiler._futures) <= 3
    latest = compiler.submit(StructuredOutput(regex="[0-9]{11}"))
    assert compiler.submit(StructuredOutput(regex="[0-9]{11}")) is latest  # still shared
    assert compiler.submit(StructuredOutput(regex="[0-9]{1}")) is not first  # compiled again
    compiler.close()


def test_a_request_that_leaves_before_its_grammar_compiles_cancels_the_compilation(shipped):
    """Aborted requests' compilations still ran, one after another, ahead of everyone who came later: a client
    that sent thousands of schemas and disconnected held up every structured request after it."""
    engine, compiler = held_engine(shipped)
    held = [engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=8,
                                                        structured={"regex": f"held:{i}[0-9]"})).request_id
            for i in range(4)]  # every worker busy
    queued = {"regex": "q[0-9]{2}"}
    b = engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=8, structured=queued))
    c = engine.add_request("ROMEO:", SamplingParams(temperature=0.7, seed=1, max_new_tokens=8, structured=queued))
    assert b.grammar is c.grammar and not b.grammar.running()
    engine.abort(b.request_id)
    assert not c.grammar.cancelled()  # c still waits for it
    engine.abort(c.request_id)
    assert c.grammar.cancelled() and StructuredOutput(**queued).key not in compiler._futures
    engine.abort(held[0])  # already compiling: it runs on, nobody is hurt
    d = engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=8, structured=queued))
    assert d.grammar is not c.grammar
    compiler.release.set()
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    for request_id in held[1:] + [d.request_id]:
        output = engine.output(request_id)
        assert output.finish_reason == "stop", (output.finish_reason, output.error)
    assert re.fullmatch("q[0-9]{2}", engine.output(d.request_id).text)
    for request_id in held + [b.request_id, c.request_id, d.request_id]:
        engine.release(request_id)
    compiler.close()


def test_an_async_engine_waiting_on_a_held_grammar_does_not_pile_up_callbacks(shipped):
    """AsyncLLM wrapped each compiling grammar's future anew every GRAMMAR_WAIT_S, each wrap adding a callback to
    it: 20 a second for as long as the compilation took, all fired at once when it ended."""
    engine, compiler = held_engine(shipped)
    llm = AsyncLLM(engine=engine)

    async def scenario():
        slow = llm.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=6, structured={"regex": "held:[0-9]"}))
        await asyncio.sleep(0.6)  # a dozen rounds of waiting
        future = next(iter(engine.requests.values())).grammar
        callbacks = len(future._done_callbacks)
        compiler.release.set()
        return callbacks, await asyncio.wait_for(slow, 30)

    callbacks, output = asyncio.run(scenario())
    assert callbacks <= 2, callbacks
    assert output.finish_reason == "stop" and re.fullmatch("held:[0-9]", output.text)
    compiler.close()


# ---------------------------------------------------------------------------------------- faults in the library
def test_a_fault_while_masking_a_guess_leaves_the_matcher_where_it_was(shipped, monkeypatch):
    """A verifying row's mask is filled after accepting the guesses before it, which are rolled back after: a
    fault in between left them accepted, and the retried step then masked the request's tokens as if they had
    been kept — an output '{name": ...' that ended with "stop", breaking its schema."""
    from minillm.structured.step_masks import StepMasks

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    prompt = '{"name": "ab", "age": 1} {"name": "ab", "age": 1} {"name": "ab", "age": 1} {"name":'
    params = [SamplingParams(temperature=0, max_new_tokens=40, structured={"json": PERSON}),
              SamplingParams(temperature=0, max_new_tokens=30)]
    expected = run(make_engine(shipped, speculative=spec), [prompt, "ROMEO:"], params)
    fill, faults = StepMasks.fill, []

    def faulty_once(self, row, matcher, guesses=()):
        if guesses and not faults:  # the second fill, after the first guess was accepted, fails
            real, calls = matcher.fill, []

            def failing(bitmask, at):
                calls.append(at)
                if len(calls) == 2:
                    faults.append(at)
                    del matcher.fill
                    raise RuntimeError("a fault in the grammar library")
                return real(bitmask, at)

            matcher.fill = failing
        return fill(self, row, matcher, guesses)

    monkeypatch.setattr(StepMasks, "fill", faulty_once)
    engine = make_engine(shipped, speculative=spec)
    outputs = run(engine, [prompt, "ROMEO:"], params)
    assert faults
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    jsonschema.validate(json.loads(outputs[0].text), PERSON)


@pytest.mark.parametrize("where", ["accept", "jump_forward", "matcher"])
def test_a_fault_in_the_grammar_library_fails_its_request_alone(shipped, monkeypatch, where):
    """A library error while following a token, finding forced text or starting a walk went out of the step
    (every request in flight ended with it); now only the request whose grammar it was fails, with the reason."""
    from minillm.structured import grammars

    others = [("Give me the record as JSON:", SamplingParams(temperature=0, max_new_tokens=60,
                                                             structured={"json": PERSON})),
              ("ROMEO:", SamplingParams(temperature=0.8, seed=2, max_new_tokens=30))]
    expected = run(make_engine(shipped, jump_forward=True), [p for p, _ in others], [q for _, q in others])
    engine = make_engine(shipped, jump_forward=True)
    victim = engine.add_request("KING:", SamplingParams(temperature=0, max_new_tokens=30,
                                                        structured={"regex": "fault: [a-z]{3}[0-9]{6}"}))
    doomed = victim.grammar.result()

    def fail_on(method):
        real = getattr(grammars.Matcher, method)

        def failing(self, *args):
            if self._grammar is doomed and (method != "accept" or getattr(self, "taken", 0) >= 3):
                raise RuntimeError(f"a fault in the grammar library's {method}")
            self.taken = getattr(self, "taken", 0) + (method == "accept")
            return real(self, *args)
        return failing

    if where == "matcher":
        real_matcher = grammars.GrammarCompiler.matcher
        monkeypatch.setattr(grammars.GrammarCompiler, "matcher", lambda self, grammar: real_matcher(self, grammar)
                            if grammar is not doomed else (_ for _ in ()).throw(RuntimeError("no walk")))
    else:
        monkeypatch.setattr(grammars.Matcher, where, fail_on(where))
    outputs = run(engine, [p for p, _ in others], [q for _, q in others])
    while engine.has_unfinished():
        engine.step()
    failed = engine.output(victim.request_id)
    engine.release(victim.request_id)
    assert failed.finish_reason == "error" and "RuntimeError" in failed.error, failed.error
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]


# ---------------------------------------------------------------------------------------- regex semantics
@pytest.mark.parametrize("regex, match", [
    ("ab\\Z", r"escape \\Z"), ("\\Aab", r"escape \\A"), ("a\\z", r"escape \\z"), ("\\Qa.b\\E", r"escape \\Q"),
    ("a^b", "'\\^' at position 1"), ("a$b", "'\\$' at position 1"), ("x(?:^a)", "'\\^' at position 4"),
])
def test_regex_constructs_the_library_would_read_otherwise_fail_their_request(shipped, regex, match):
    """xgrammar matched \\Z as the letter Z and dropped a ^ or $ inside a sequence: every output of 'ab\\Z' was
    'abZ', every output of 'a$b' was 'ab', each ending with "stop" and matching nothing in Python's re. Now the
    request fails with the reason (when its grammar compiles: a server checks these first, in its own words)."""
    model, tokenizer = shipped
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    with pytest.raises(ValueError, match=match):
        compiler.compile(StructuredOutput(regex=regex))
    for fine in ("^ab$", "a|^b", "a$|b", "(^a|b)", "[$^]", "\\^\\$", "\\d\\w\\s\\x41"):
        compiler.compile(StructuredOutput(regex=fine))
    compiler.close()
    engine = make_engine(shipped)
    outputs = run(engine, ["a", "b"], [SamplingParams(structured={"regex": regex}), SamplingParams(max_new_tokens=3)])
    assert outputs[0].finish_reason == "error" and re.search(match, outputs[0].error), outputs[0].error
    assert outputs[1].finish_reason == "length"


def test_a_dot_in_a_regex_matches_no_newline(shipped):
    """xgrammar's '.' matches a newline too: most of these outputs ended with "stop" and failed re.fullmatch."""
    regex = "ROMEO:(.){1,6}"
    engine = make_engine(shipped, max_num_seqs=8)
    prompt = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n"
    outputs = run(engine, [prompt] * 8, [SamplingParams(temperature=1.2, seed=i, max_new_tokens=20,
                                                        structured={"regex": regex}) for i in range(8)])
    assert all(o.finish_reason == "stop" for o in outputs)
    assert all(re.fullmatch(regex, o.text) for o in outputs), [o.text for o in outputs]


# ---------------------------------------------------------------------------------------- grammars that crash
def test_a_grammar_that_crashes_the_library_fails_its_request_alone(shipped):
    """xgrammar 0.2.9 segfaults compiling `root ::= root{2}` (a rule repeated into itself): the compile thread
    took the engine's whole process down — the engine core's, or a server's. A user's EBNF grammar is now
    compiled in a separate process first; one that kills it is refused with the reason, and the next grammar
    gets a fresh one."""
    grammars = ["root ::= root{2}", 'root ::= x{1}\nx ::= root', 'root ::= ("a" | "b"){2,3}']
    others = [("ROMEO:", SamplingParams(temperature=0.8, seed=4, max_new_tokens=20)),
              ("Give me the record as JSON:", SamplingParams(temperature=0, max_new_tokens=40,
                                                             structured={"json": PERSON}))]
    expected = run(make_engine(shipped), [p for p, _ in others], [q for _, q in others])
    engine = make_engine(shipped)
    outputs = run(engine, ["a:", "b:", "c:"] + [p for p, _ in others],
                  [SamplingParams(temperature=0, max_new_tokens=10, structured={"grammar": g}) for g in grammars]
                  + [q for _, q in others])
    for crashed in outputs[:2]:
        assert crashed.finish_reason == "error" and "crashes the grammar library" in crashed.error, crashed.error
        assert "SIGSEGV" in crashed.error
    assert outputs[2].finish_reason == "stop" and re.fullmatch("[ab]{2,3}", outputs[2].text)
    assert [o.token_ids for o in outputs[3:]] == [o.token_ids for o in expected]
    engine.structured.close()


SLOW_SCHEMA = {"type": "string", "pattern": "([a-z]{1,100}){1,100}"}  # ~8 s to compile on this course's CPU


def test_a_schema_the_sandbox_cannot_compile_in_time_is_refused(shipped, monkeypatch):
    """Nested counted repeats in a pattern: the library writes them out (8 s here, while the same regex as a
    `regex` constraint takes ms). Compiled in the sandbox, under its deadline, and refused past it."""
    from minillm.structured import grammars

    monkeypatch.setattr(grammars, "SANDBOX_TIMEOUT_S", 1.0)
    model, tokenizer = shipped
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    with pytest.raises(ValueError, match="took longer than 1 s to compile"):
        compiler.compile(StructuredOutput(json=SLOW_SCHEMA))
    assert compiler._sandbox._process is None  # killed
    quick = compiler.compile(StructuredOutput(json={"type": "string", "pattern": "[a-z]{2,3}"}))  # a fresh child
    matcher = compiler.matcher(quick)
    assert all(matcher.accept(t) for t in tokenizer.encode('"abc"', add_special_tokens=False))
    compiler.close()


def test_slow_sandboxed_compiles_hold_up_no_other_constraint(shipped, monkeypatch):
    """More slow schemas than the compiler has workers: a regex, a choice and a plain schema still compile
    at once (the sandbox has a worker of its own), while the slow ones wait for it in turn."""
    from minillm.structured import grammars

    monkeypatch.setattr(grammars, "SANDBOX_TIMEOUT_S", 2.0)
    model, tokenizer = shipped
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    slow_constraints = [StructuredOutput(json=SLOW_SCHEMA | {"title": f"slow {i}"})
                        for i in range(grammars.COMPILE_WORKERS + 1)]
    slow = [compiler.submit(constraint) for constraint in slow_constraints]
    quick = [compiler.submit(c) for c in (StructuredOutput(regex="([a-z]{1,100}){1,100}"),
                                          StructuredOutput(choice=["yes", "no"]),
                                          StructuredOutput(json={"type": "object"}))]
    for future in quick:
        future.result(timeout=60)
    assert not slow[-1].done()  # behind the others in the sandbox: at least 2 s x 4 away
    for constraint, future in zip(slow_constraints[1:], slow[1:], strict=True):
        compiler.cancel(constraint, future)  # those not started never will
    assert slow[-1].cancelled()
    with pytest.raises(ValueError, match="took longer than 2 s"):
        slow[0].result(timeout=60)
    compiler.close()
