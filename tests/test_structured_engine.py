"""Structured outputs in the engine (chapter 11), on the shipped target and tokenizer: every output that
ends is valid — whatever schema or regex, greedy or sampled, with speculative decoding, the prefix
cache, chunked prefill, preemption, n samples, a compiled decode step — and nothing ends for another
reason than stop or length. A mask that allows everything changes nothing; speculative decoding keeps
constrained greedy tokens exact; a grammar that compiles slowly delays only its own request."""

import asyncio
import dataclasses
import json
import re
import threading

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minillm
from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.structured import StructuredOutput
from minillm.structured.grammars import GrammarCompiler
from tests.test_engine import paged_budget

PROMPTS = ["ROMEO:", "Give me the record as JSON:", "First Citizen:\nBefore we proceed any further, hear me speak.",
           "KING RICHARD III:\nNow is the winter"]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "mood": {"enum": ["glad", "sad", "wroth"]}},
          "required": ["name", "age", "mood"], "additionalProperties": False}
EMAIL = r"[a-z]{2,6}@[a-z]{2,5}\.(com|org|net)"


@pytest.fixture(scope="module")
def shipped():
    return minillm.load_model(), minillm.load_tokenizer()


CONFIGS = {
    "paged+prefix": dict(kv="paged", prefix_cache=True),
    "contiguous": dict(kv="contiguous"),
    "chunked": dict(kv="paged", chunked_prefill=True, max_tokens_per_prefill_chunk=8),
    "ngram": dict(kv="paged", speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3)),
    "draft": dict(kv="paged", prefix_cache=True, speculative=SpeculativeConfig(method="draft",
                                                                               num_speculative_tokens=3)),
}


def make_engine(shipped, **options) -> LLMEngine:
    model, tokenizer = shipped
    options = {"max_num_seqs": 6, "max_model_len": 512, "max_tokens_per_step": 256, **options}
    return LLMEngine(model, tokenizer, EngineConfig(**options))


def run(engine: LLMEngine, prompts, params) -> list:
    ids = [engine.add_request(p, sp).request_id for p, sp in zip(prompts, params)]
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.output(i) for i in ids]
    for i in ids:
        engine.release(i)
    return outputs


def check(constraint: StructuredOutput, text: str) -> None:
    """The text is what the constraint asks for."""
    if constraint.kind == "json":
        jsonschema.validate(json.loads(text), constraint.json)
    elif constraint.kind == "json_object":
        assert isinstance(json.loads(text), dict), text
    elif constraint.kind == "regex":
        assert re.fullmatch(constraint.regex, text), text
    elif constraint.kind == "choice":
        assert text in constraint.choice, text


# ---------------------------------------------------------------------------------------- random schemas
def _leaves():
    bounds = st.tuples(st.integers(-1000, 1000), st.integers(0, 2000)).map(lambda t: (t[0], t[0] + t[1]))
    return st.one_of(
        bounds.map(lambda b: {"type": "integer", "minimum": b[0], "maximum": b[1]}),
        bounds.map(lambda b: {"type": "number", "minimum": b[0], "maximum": b[1]}),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.integers(1, 8).map(lambda n: {"type": "string", "maxLength": n}),
        st.lists(st.one_of(st.text("abcxyz ", min_size=1, max_size=6), st.integers(-50, 50)), min_size=1,
                 max_size=4, unique=True).map(lambda values: {"enum": values}),
    )


def _containers(children):
    arrays = st.tuples(children, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]})
    objects = st.dictionaries(st.sampled_from(["id", "name", "size", "tags", "when", "ok"]), children, min_size=1,
                              max_size=4).flatmap(lambda props: st.lists(st.sampled_from(sorted(props)), unique=True)
                                                  .map(lambda req: {"type": "object", "properties": props,
                                                                    "required": req, "additionalProperties": False}))
    return st.one_of(arrays, objects)


schemas = st.recursive(_leaves(), _containers, max_leaves=6).filter(lambda s: s.get("type") in ("object", "array"))
regexes = st.lists(st.sampled_from([r"[a-z]{1,4}", r"[0-9]{2,3}", r"(yes|no)", r"-", r"\.", r"[A-F0-9]{4}", r"x?",
                                    r"(ab|cd)+", r" "]), min_size=1, max_size=5).map("".join)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=schemas, regex=regexes, seed=st.integers(0, 2**32))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_output_that_ends_is_valid_and_none_ends_otherwise(shipped, name, schema, regex, seed):
    engine = make_engine(shipped, **CONFIGS[name])
    constraints = [StructuredOutput(json=schema), StructuredOutput(regex=regex)]
    prompts, params = [], []
    for i, constraint in enumerate(constraints * 2):  # each constraint greedy and sampled
        prompts.append(PROMPTS[i % len(PROMPTS)])
        params.append(SamplingParams(temperature=0 if i < 2 else 0.9, seed=seed + i, max_new_tokens=120,
                                     structured=constraint))
    outputs = run(engine, prompts, params)
    for output, p in zip(outputs, params):
        assert output.finish_reason in ("stop", "length"), (output.finish_reason, output.error)
        if output.finish_reason == "stop":
            check(p.structured, output.text)


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(examples=st.lists(schemas, min_size=12, max_size=12))
def test_most_random_schema_outputs_end(shipped, examples):
    """The property above checks the outputs that end: here they are the rule, not the exception (the
    shipped model stops inside its budget for most schemas)."""
    engine = make_engine(shipped, kv="paged", prefix_cache=True)
    params = [SamplingParams(temperature=0.7, seed=i, max_new_tokens=200, structured={"json": s})
              for i, s in enumerate(examples)]
    outputs = run(engine, [PROMPTS[i % 4] for i in range(len(examples))], params)
    stopped = [o for o in outputs if o.finish_reason == "stop"]
    assert len(stopped) >= len(outputs) // 2, [(o.finish_reason, o.text[-40:]) for o in outputs]
    for output, p in zip(outputs, params):
        if output.finish_reason == "stop":
            check(p.structured, output.text)


# ---------------------------------------------------------------------------------------- exactness
def test_a_constraint_that_allows_everything_gives_the_unconstrained_greedy_tokens(shipped):
    engine = make_engine(shipped, kv="paged")
    plain = run(engine, PROMPTS, [SamplingParams(temperature=0, max_new_tokens=60)] * len(PROMPTS))
    anything = SamplingParams(temperature=0, max_new_tokens=60, structured={"regex": r"[\s\S]*"})
    constrained = run(engine, PROMPTS, [anything] * len(PROMPTS))
    assert [o.token_ids for o in constrained] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in constrained] == [o.finish_reason for o in plain]


@pytest.mark.parametrize("name", ["ngram", "draft", "chunked", "contiguous"])
def test_constrained_greedy_tokens_are_the_same_under_every_mechanism(shipped, name):
    """Speculative decoding verifies guesses under the grammar (each guess row masked after the guesses
    before it): greedy tokens stay exactly those of the plain engine."""
    digits = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 5}
    constraints = [StructuredOutput(json=PERSON), StructuredOutput(regex=EMAIL), StructuredOutput(json=digits),
                   StructuredOutput(choice=("to be", "not to be"))]
    params = [SamplingParams(temperature=0, max_new_tokens=80, structured=c) for c in constraints]
    expected = run(make_engine(shipped, kv="paged"), PROMPTS, params)
    got = run(make_engine(shipped, **CONFIGS[name]), PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    for output, c in zip(got, constraints):
        assert output.finish_reason == "stop", output.text
        check(c, output.text)


def test_a_refused_guess_costs_only_that_guess(shipped):
    """An n-gram proposer guesses from the prompt, whose words the grammar mostly refuses: the
    output is still valid and exact, and guesses the grammar allows are still kept."""
    engine = make_engine(shipped, kv="paged", speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    prompt = "aaaa bbbb aaaa bbbb aaaa bbbb aaaa bbbb"
    params = SamplingParams(temperature=0, max_new_tokens=40, structured={"regex": r"(aaaa |bbbb ){6}"})
    expected = run(make_engine(shipped, kv="paged"), [prompt], [params])[0]
    output = run(engine, [prompt], [params])[0]
    assert output.token_ids == expected.token_ids and output.finish_reason == "stop"
    assert re.fullmatch(r"(aaaa |bbbb ){6}", output.text)
    assert engine.speculative_metrics["accepted"] > 0


def test_preempted_requests_keep_their_walk_through_the_grammar(shipped):
    model, _ = shipped
    params = [SamplingParams(temperature=0, max_new_tokens=70, structured={"json": PERSON}) for _ in range(4)]
    expected = run(make_engine(shipped, kv="paged"), PROMPTS, params)
    tight = make_engine(shipped, kv="paged", block_size=8, kv_cache_bytes=paged_budget(model, 8, 22))
    got = run(tight, PROMPTS, params)
    assert tight.num_preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]


def test_n_samples_each_walk_their_own_grammar(shipped):
    engine = make_engine(shipped, kv="paged", prefix_cache=True)
    params = SamplingParams(temperature=1.0, seed=7, n=4, max_new_tokens=120, structured={"json": PERSON})
    output = run(engine, ["ROMEO:"], [params])[0]
    assert len(output.outputs) == 4
    assert len({tuple(o.token_ids) for o in output.outputs}) > 1  # independent samples
    for sample in output.outputs:
        assert sample.finish_reason in ("stop", "length")
        if sample.finish_reason == "stop":
            check(params.structured, sample.text)
    assert any(s.finish_reason == "stop" for s in output.outputs)


def test_the_compiled_decode_step_takes_the_mask_outside(shipped):
    params = [SamplingParams(temperature=0, max_new_tokens=40, structured={"regex": EMAIL}),
              SamplingParams(temperature=0, max_new_tokens=40)]
    prompts = PROMPTS[:2]
    expected = run(make_engine(shipped, kv="paged", max_num_seqs=2), prompts, params)
    engine = make_engine(shipped, kv="paged", max_num_seqs=2, compile=True, graph_batch_sizes=(2,))
    got = run(engine, prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert any(step.recorded_batch == 2 for step in engine.trace.steps)


# ---------------------------------------------------------------------------------------- compilation
class HeldCompiler(GrammarCompiler):
    """Compiles like the real one, but a constraint whose regex starts with "held:" waits for `release`:
    a grammar that takes as long as the test wants."""

    release = threading.Event()

    def _compile(self, constraint):
        if constraint.kind == "regex" and constraint.regex.startswith("held:"):
            assert self.release.wait(30)
        return super()._compile(constraint)


def test_a_slow_grammar_delays_only_its_own_request(shipped):
    engine = make_engine(shipped, kv="paged")
    model, tokenizer = shipped
    engine.structured._compiler = HeldCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    HeldCompiler.release.clear()
    slow = engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=20,
                                                       structured={"regex": "held:[a-z]{3}"})).request_id
    fast = engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=20,
                                                       structured={"regex": "[0-9]{5}"})).request_id
    free = engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=20)).request_id
    steps = 0
    while not (engine.is_done(fast) and engine.is_done(free)):
        engine.step()
        steps += 1
        assert steps < 100
    assert not engine.is_done(slow) and engine.requests[slow].num_output_tokens == 0
    assert engine.output(fast).finish_reason == "stop" and re.fullmatch("[0-9]{5}", engine.output(fast).text)
    assert engine.waiting_for_grammars() == [engine.requests[slow].grammar]
    assert engine.step() == []  # nothing else to do: the step waits a moment for the grammar, then does nothing
    HeldCompiler.release.set()
    while engine.has_unfinished():
        engine.step()
    assert engine.output(slow).text.startswith("held:") and engine.output(slow).finish_reason == "stop"
    for request_id in (slow, fast, free):
        engine.release(request_id)


def test_the_async_engine_serves_others_while_a_grammar_compiles(shipped):
    model, tokenizer = shipped
    engine = make_engine(shipped, kv="paged")
    engine.structured._compiler = HeldCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    HeldCompiler.release.clear()
    llm = AsyncLLM(engine=engine)

    async def scenario():
        slow = llm.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=10,
                                                  structured={"regex": "held:[0-9]{2}"}))
        fast = await llm.submit("ROMEO:", SamplingParams(temperature=0, max_new_tokens=10))
        assert fast.finish_reason == "length" and not slow.done()
        HeldCompiler.release.set()
        return await slow

    output = asyncio.run(scenario())
    assert re.fullmatch("held:[0-9]{2}", output.text) and output.finish_reason == "stop"


def test_the_engine_core_sends_no_empty_steps_while_a_grammar_compiles(shipped):
    """The core process's loop, run here on a thread between two pipes: while its only request waits for its
    grammar, the core waits too — no CoreStep every few ms with nothing in it — and then serves it."""
    import os
    import time
    from multiprocessing import Pipe

    from minillm.engine_core.core import EngineCore
    from minillm.engine_core.messages import AddRequest, CoreStep, Shutdown

    model, tokenizer = shipped
    engine = make_engine(shipped, kv="paged")
    engine.structured._compiler = HeldCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    HeldCompiler.release.clear()
    core_inbox, front_outbox = Pipe(duplex=False)
    front_inbox, core_outbox = Pipe(duplex=False)
    core = threading.Thread(target=EngineCore(engine, core_inbox, core_outbox, os.getppid()).run)
    core.start()
    params = SamplingParams(temperature=0, max_new_tokens=8, structured={"regex": "held:[0-9]{2}"})
    front_outbox.send(AddRequest("r0", tokenizer.encode("ROMEO:"), params, time.perf_counter()))
    time.sleep(1.0)  # 20 waits of GRAMMAR_WAIT_S
    held: list[CoreStep] = []
    while front_inbox.poll(0):
        held.append(front_inbox.recv())
    assert len(held) <= 1 and not any(step.samples for step in held)  # at most the news of the message itself
    HeldCompiler.release.set()
    tokens: list[int] = []
    while not (step := front_inbox.recv()).done:
        tokens += [t for sample in step.samples for t in sample.token_ids]
    tokens += [t for sample in step.samples for t in sample.token_ids]
    assert step.done[0].finish_reasons == ("stop",)
    assert re.fullmatch("held:[0-9]{2}", tokenizer.decode(tokens, skip_special_tokens=True))
    front_outbox.send(Shutdown())
    core.join(30)
    assert not core.is_alive()


def test_a_closed_engine_or_a_dropped_compiler_ends_its_grammar_sandbox(shipped):
    """The compiler's process (user grammars compile there) and threads end when the engine is closed, or
    when the compiler is garbage-collected. (This suite's fixture keeps every engine for its leak checks, so
    the dropped one here is a compiler of its own.)"""
    import gc

    model, tokenizer = shipped
    engine = make_engine(shipped, kv="paged")
    outputs = run(engine, ["ROMEO:"], [SamplingParams(temperature=0, max_new_tokens=4,
                                                      structured={"grammar": 'root ::= "ab"'})])
    assert outputs[0].text == "ab"
    sandbox = engine.structured.compiler._sandbox._process
    assert sandbox is not None and sandbox.poll() is None
    engine.close()
    assert sandbox.wait(10) is not None
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    compiler.compile(StructuredOutput(grammar='root ::= "ab"'))
    sandbox = compiler._sandbox._process
    del compiler
    gc.collect()
    assert sandbox.wait(10) is not None


def test_a_grammar_that_does_not_compile_fails_its_request_alone(shipped):
    engine = make_engine(shipped, kv="paged")
    bad = engine.add_request("ROMEO:", SamplingParams(max_new_tokens=5, structured={"regex": "(unclosed"}))
    good = engine.add_request("ROMEO:", SamplingParams(temperature=0, max_new_tokens=5))
    while engine.has_unfinished():
        engine.step()
    out = engine.output(bad.request_id)
    assert out.finish_reason == "error" and "regex" in out.error and "could not be compiled" in out.error
    assert engine.output(good.request_id).finish_reason == "length"
    engine.release(bad.request_id)
    engine.release(good.request_id)


def test_structured_params_are_checked_at_the_door():
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured={})
    with pytest.raises(ValueError, match="fields are"):
        SamplingParams(structured={"schema": {}})
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=3, structured={"regex": "a+"})
    with pytest.raises(ValueError, match="StructuredOutput or a dict"):
        SamplingParams(structured="json")
    a = SamplingParams(structured={"json": {"type": "object", "required": ["a"], "properties": {"a": {}}}})
    b = SamplingParams(structured={"json": '{"type": "object", "required": ["a"],\n "properties": {"a": {}}}'})
    assert a == b and hash(a) == hash(b)
    assert dataclasses.replace(a, structured=None) != a


# ---------------------------------------------------------------------------------------- jump-forward
RECORDS = {"type": "object", "properties": {"character_name": {"type": "string", "maxLength": 10},
                                            "years_of_age": {"type": "integer", "minimum": 0, "maximum": 120},
                                            "disposition": {"enum": ["melancholy", "choleric", "sanguine"]}},
           "required": ["character_name", "years_of_age", "disposition"], "additionalProperties": False}


def passes(engine: LLMEngine) -> int:
    """Forward passes that computed anything."""
    return sum(1 for step in engine.trace.steps if step.num_tokens)


def test_jump_forward_appends_the_forced_text_and_saves_passes(shipped):
    params = [SamplingParams(temperature=0, max_new_tokens=80, structured={"json": RECORDS}) for _ in PROMPTS]
    plain = make_engine(shipped, kv="paged")
    jumping = make_engine(shipped, kv="paged", jump_forward=True)
    without, with_jumps = run(plain, PROMPTS, params), run(jumping, PROMPTS, params)
    for output in without + with_jumps:
        assert output.finish_reason == "stop"
        check(StructuredOutput(json=RECORDS), output.text)
    assert jumping.jump_forward_tokens > 0
    tokens = sum(len(o.token_ids) for o in with_jumps)
    assert tokens / passes(jumping) > sum(len(o.token_ids) for o in without) / passes(plain)
    # the keys and the enum's forced tails came without sampling: here at least a third of the tokens
    assert jumping.jump_forward_tokens >= tokens / 3, (jumping.jump_forward_tokens, tokens)


@pytest.mark.parametrize("name", ["ngram", "draft", "chunked", "contiguous"])
def test_jump_forward_tokens_are_the_same_under_every_mechanism(shipped, name):
    params = [SamplingParams(temperature=0, max_new_tokens=80, structured={"json": RECORDS}),
              SamplingParams(temperature=0, max_new_tokens=40, structured={"regex": EMAIL}),
              SamplingParams(temperature=0, max_new_tokens=40),
              SamplingParams(temperature=0.8, seed=3, max_new_tokens=60, structured={"json": PERSON})]
    expected = run(make_engine(shipped, kv="paged", jump_forward=True), PROMPTS, params)
    got = run(make_engine(shipped, jump_forward=True, **CONFIGS[name]), PROMPTS, params)
    assert [o.token_ids for o in got[:3]] == [o.token_ids for o in expected[:3]]  # greedy: exact
    for output, p in zip(got, params):
        assert output.finish_reason in ("stop", "length")
        if p.structured is not None and output.finish_reason == "stop":
            check(p.structured, output.text)


def test_jump_forward_respects_the_length_limits_and_preemption(shipped):
    model, _ = shipped
    params = [SamplingParams(temperature=0, max_new_tokens=n, structured={"json": RECORDS}) for n in (3, 7, 12, 80)]
    expected = run(make_engine(shipped, kv="paged", jump_forward=True), PROMPTS, params)
    for output, p in zip(expected, params):
        assert len(output.token_ids) <= p.max_new_tokens
        assert output.finish_reason == ("length" if p.max_new_tokens < 50 else "stop")
    params = [SamplingParams(temperature=0, max_new_tokens=80, structured={"json": RECORDS})] * len(PROMPTS)
    expected = run(make_engine(shipped, kv="paged", jump_forward=True), PROMPTS, params)
    tight = make_engine(shipped, kv="paged", jump_forward=True, block_size=8, kv_cache_bytes=paged_budget(model, 8, 13))
    assert [o.token_ids for o in run(tight, PROMPTS, params)] == [o.token_ids for o in expected]
    assert tight.num_preemptions > 0


@pytest.mark.parametrize("speculative", [None, SpeculativeConfig(method="ngram", num_speculative_tokens=3)])
def test_a_grammar_that_allows_nothing_fails_its_request_alone(shipped, speculative, monkeypatch):
    """A fault put in the matcher: once 'dead' is written, the mask allows no token (as for a grammar the
    vocabulary cannot continue). That request ends with an error saying so; the others get exactly their tokens."""
    from minillm.structured.grammars import Matcher

    fill = Matcher.fill

    def dead_after_four_characters(self, bitmask, row):
        fill(self, bitmask, row)
        if getattr(self, "walked", "").startswith("dead"):
            bitmask[row] = 0

    accept = Matcher.accept

    def remembering(self, token_id):
        ok = accept(self, token_id)
        if ok:
            self.walked = getattr(self, "walked", "") + shipped[1].decode([token_id])
        return ok

    monkeypatch.setattr(Matcher, "fill", dead_after_four_characters)
    monkeypatch.setattr(Matcher, "accept", remembering)
    params = [SamplingParams(temperature=0, max_new_tokens=30, structured={"regex": "dead[a-z]+"}),
              SamplingParams(temperature=0.7, seed=1, max_new_tokens=30, structured={"regex": "dead[a-z]+"}),
              SamplingParams(temperature=0, max_new_tokens=30, structured={"regex": EMAIL}),
              SamplingParams(temperature=0, max_new_tokens=30)]
    engine = make_engine(shipped, kv="paged", speculative=speculative)
    outputs = run(engine, PROMPTS, params)
    for output in outputs[:2]:
        assert output.finish_reason == "error" and "allows no token" in output.error, (output.text, output.error)
        assert output.text.startswith("dead") and len(output.text) <= 8
    monkeypatch.undo()
    expected = run(make_engine(shipped, kv="paged"), PROMPTS[2:], params[2:])
    assert [o.token_ids for o in outputs[2:]] == [o.token_ids for o in expected]


def test_schema_keywords_the_library_would_ignore_fail_their_request_with_the_reason(shipped):
    """xgrammar drops `not`, `multipleOf` on numbers, `uniqueItems`...: through the engine's own API too, such
    a schema fails its request, naming the keyword, rather than run as if the keyword were not there."""
    engine = make_engine(shipped, kv="paged")
    ignored = [{"type": "object", "properties": {"a": {"type": "integer", "not": {"const": 3}}}},
               {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
               {"type": "object", "properties": {"x": {"minimum": 100}}}]
    params = [SamplingParams(max_new_tokens=5, structured={"json": s}) for s in ignored]
    params.append(SamplingParams(temperature=0, max_new_tokens=5))
    outputs = run(engine, PROMPTS, params)
    for output, word in zip(outputs, ("not", "uniqueItems", "minimum")):
        assert output.finish_reason == "error" and word in output.error, output.error
    assert outputs[-1].finish_reason == "length"
