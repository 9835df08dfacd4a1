"""Structured outputs' parts (minillm/structured/): a constraint is checked when it is made; compiled
against the shipped tokenizer, its mask lets through only what completes it — a walk that takes any
allowed token ends in a valid JSON document, a full regex match or one of the choices — and
rollback restores the matcher exactly."""

import json
import re

import jsonschema
import pytest
import torch

import minillm
from minillm.structured import GrammarCompiler, Matcher, StructuredOutput
from minillm.structured.grammars import allocate_bitmask, apply_bitmask

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def shipped():
    model, tokenizer = minillm.load_model(), minillm.load_tokenizer()
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
    yield compiler, tokenizer, model.config
    compiler.close()


def walk(compiler, tokenizer, config, constraint, seed: int, limit: int = 300) -> tuple[str, bool]:
    """Random logits, masked, sampled, until the matcher ends: (the text, whether it ended)."""
    matcher = Matcher(compiler.compile(constraint))
    generator = torch.Generator().manual_seed(seed)
    bitmask, tokens = allocate_bitmask(1, config.vocab_size), []
    for _ in range(limit):
        matcher.fill(bitmask, 0)
        logits = torch.randn(1, config.vocab_size, generator=generator) * 3
        apply_bitmask(logits, bitmask)
        token = int(torch.multinomial(logits.softmax(-1), 1, generator=generator))
        assert matcher.accept(token)
        if matcher.is_finished:
            assert token in config.eos_token_ids
            return tokenizer.decode(tokens), True
        tokens.append(token)
    return tokenizer.decode(tokens), False


@pytest.mark.parametrize("seed", range(6))
def test_every_walk_through_a_json_schema_ends_in_a_valid_document(shipped, seed):
    text, ended = walk(*shipped, StructuredOutput(json=SCHEMA), seed)
    assert ended, text
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("seed", range(4))
def test_regexes_choices_and_json_objects_are_matched_whole(shipped, seed):
    text, ended = walk(*shipped, StructuredOutput(regex=r"[a-z]{2,5}@[0-9]{1,3}\.(com|org)"), seed)
    assert ended and re.fullmatch(r"[a-z]{2,5}@[0-9]{1,3}\.(com|org)", text), text
    choices = ("yes", "no", 'say "maybe"')
    text, ended = walk(*shipped, StructuredOutput(choice=choices), seed)
    assert ended and text in choices
    text, ended = walk(*shipped, StructuredOutput(json_object=True), seed, limit=2000)
    assert not ended or isinstance(json.loads(text), dict)


def test_rollback_restores_the_mask(shipped):
    compiler, tokenizer, config = shipped
    matcher = Matcher(compiler.compile(StructuredOutput(json=SCHEMA)))
    before, after = allocate_bitmask(1, config.vocab_size), allocate_bitmask(1, config.vocab_size)
    tokens = tokenizer.encode('{"name": "Ann", "age": 4')
    for token in tokens[:3]:
        assert matcher.accept(token)
    matcher.fill(before, 0)
    for token in tokens[3:]:
        assert matcher.accept(token)
    matcher.rollback(len(tokens) - 3)
    matcher.fill(after, 0)
    assert torch.equal(before, after)
    assert not matcher.accept(tokenizer.encode("]")[0])  # refused, and nothing changed
    matcher.fill(after, 0)
    assert torch.equal(before, after)


def test_jump_forward_gives_the_text_the_grammar_forces(shipped):
    compiler, tokenizer, _ = shipped
    matcher = Matcher(compiler.compile(StructuredOutput(json=SCHEMA)))
    assert matcher.jump_forward() == '{"name": "'  # the first required key, in the schema's order
    for token in tokenizer.encode('{"name": "Ann"'):
        assert matcher.accept(token)
    assert matcher.jump_forward() == ', "age": '
    for token in tokenizer.encode(', "age": 7'):
        assert matcher.accept(token)
    assert matcher.jump_forward() == ""  # a digit, a comma or the end: a choice to make


def test_equal_constraints_share_one_compilation(shipped):
    compiler = shipped[0]
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["a"]}
    first = compiler.submit(StructuredOutput(json=schema))
    again = compiler.submit(StructuredOutput(json=json.dumps(schema, indent=2)))
    assert first is again and first.result() is again.result()
    assert compiler.submit(StructuredOutput(regex="a+")) is not first
    # the properties listed in another order are another constraint: the output follows the order given
    swapped = {**schema, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    assert compiler.submit(StructuredOutput(json=swapped)) is not first
    for given, keys in ((schema, ["b", "a"]), (swapped, ["a", "b"])):
        constraint = StructuredOutput(json={**given, "required": ["a", "b"]})
        text, ended = walk(compiler, shipped[1], shipped[2], constraint, seed=0)
        assert ended and list(json.loads(text)) == keys, text


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of json, json_object, regex, choice, grammar; got none"),
    ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
    ({"json": "{not json"}, "its text does not parse"),
    ({"json": [1, 2]}, "an object"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"choice": "yes"}, "choice must be a list of non-empty strings"),
    ({"choice": ["yes", ""]}, "choice must be a list of non-empty strings"),
    ({"json_object": 1}, "json_object must be True or False"),
    ({"grammar": "root ::= " + '"a" | ' * 30_000 + '"b"'}, "at most 100,000 are accepted"),
])
def test_a_malformed_constraint_is_refused_when_made(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        StructuredOutput(**kwargs)


@pytest.mark.parametrize("constraint, reason", [
    (StructuredOutput(regex="(ab"), "the regex constraint could not be compiled: Regex parsing error"),
    (StructuredOutput(grammar="root ::= "), "the grammar constraint could not be compiled: EBNF parser error"),
    (StructuredOutput(json={"type": "nonsense"}), '$.type must be one of string, integer'),
])
def test_what_the_library_cannot_compile_fails_its_future_with_the_reason(shipped, constraint, reason):
    future = shipped[0].submit(constraint)
    with pytest.raises(ValueError, match=re.escape(reason)):
        future.result()


@pytest.mark.parametrize("vocab", [4096, 4001, 33])
def test_the_c_mask_loop_masks_exactly_what_the_library_does(vocab):
    """minillm/structured/csrc/bitmask.c against xgrammar's own routine: random bitmasks (and words all ones,
    all zeros), a vocabulary that ends inside a word, a subset of the rows, a strided logits view."""
    import xgrammar as xgr

    from minillm.structured.grammars import _bitmask_library

    assert not isinstance(_bitmask_library(), str), _bitmask_library()  # the C loop is what runs here
    generator = torch.Generator().manual_seed(vocab)
    words = -(-vocab // 32)
    bitmask = torch.randint(-2**31, 2**31 - 1, (6, words), dtype=torch.int32, generator=generator)
    bitmask[1] = -1  # every token allowed
    bitmask[2] = 0  # none
    bitmask[3, ::2] = -1
    wide = torch.randn(6, vocab + 7, generator=generator)
    for rows in ([0, 1, 2, 3, 4, 5], [5, 2, 0], []):
        mine, theirs = wide.clone()[:, :vocab], wide.clone()[:, :vocab]
        apply_bitmask(mine, bitmask, rows)
        xgr.apply_token_bitmask_inplace(theirs, bitmask, indices=rows or None) if rows else None
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("pattern", ["a.b", "a.{1,3}b"])  # the second compiles in the sandbox (a counted repeat)
def test_a_dot_in_a_schema_pattern_never_writes_a_line_break(shipped, pattern):
    """A pattern's "." means any character but a line break (ECMA-262, as jsonschema reads it with Python's re);
    in the JSON text a line break could only come raw (invalid JSON) or escaped (then "." would match it)."""
    compiler, tokenizer, _ = shipped
    grammar = compiler.compile(StructuredOutput(json={"type": "string", "pattern": pattern}))
    for text, allowed in (('"axb"', True), ('"a\nb"', False), ('"a\\nb"', False), ('"a\\u000ab"', False)):
        matcher = Matcher(grammar)
        accepted = all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
        assert accepted == allowed, text
