"""Structured outputs through the server (chapter 11), on the shipped model and its real tokenizer,
with the engine core in its own process (the server's default: the constraint crosses the process
boundary inside SamplingParams). The official `openai` client gets schema-valid JSON through
response_format (json_schema, json_object, a pydantic model through `parse`), a regex, a choice and a
grammar through vLLM's structured_outputs, and valid tool calls through a named or "required"
tool_choice — streaming or not, chat and completions. What xgrammar would ignore, or cannot compile,
is a 400 with the reason before anything is queued; a constraint that fails inside the engine ends
that request alone, with a clear error."""

import json
import re
import threading
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

import minillm
from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.engine_core import ProcessAsyncLLM
from minillm.server import build_app
from minillm.server.chat_template import render_chat
from minillm.server.grammar_check import GrammarCheck
from minillm.server.tools import ArrayItems, ToolError, parse_tools
from minillm.structured.schema_support import check_schema
from tests.hf_reference import ByteTokenizer
from tests.test_server import _config, _Server
from tests.test_server_openai import char_tokenizer

MODEL = "shipped"
CONFIG = EngineConfig(max_num_seqs=4, max_model_len=512)
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "mood": {"enum": ["glad", "sad", "wroth"]}},
          "required": ["name", "age", "mood"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Rome", "Paris", "Verona"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ring_bell"}},  # no parameters: any object, as OpenAI reads it
         {"type": "function", "function": {"name": "greet", "parameters": {
             "type": "object", "properties": {"who": {"type": "string", "pattern": "[A-Z][a-z]{1,8}"}},
             "required": ["who"], "additionalProperties": False}}}]
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}
ASK = [{"role": "user", "content": "Who art thou?"}]
EMAIL = r"[a-z]{2,6}@[a-z]{2,5}\.(com|org|net)"
GRAMMAR = 'root ::= answer " " num\nanswer ::= "ay" | "nay"\nnum ::= [0-9] [0-9]?'
DEAD_END = 'root ::= "a" rest\nrest ::= rest "b"'  # compiles, and its first token is allowed: then nothing is


@pytest.fixture(scope="module")
def served():
    llm = ProcessAsyncLLM(config=CONFIG, threads=1)
    server = _Server(build_app(llm, MODEL, default_max_tokens=64))
    yield server
    server.stop()
    llm.close()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def chat(extra: dict, **fields) -> dict:
    return {"model": MODEL, "messages": ASK, "max_tokens": 64, "temperature": 0} | fields | extra


def events(response: httpx.Response) -> list[dict | str]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in response.text.splitlines() if line.startswith("data: ")]


def check_call(call) -> dict:
    """A tool call from the SDK: its id, type and name are OpenAI's; its arguments match the function."""
    assert call.id.startswith("call_") and call.type == "function"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, PARAMETERS[call.function.name])
    return arguments


# ----------------------------------------------------------------------------------------------- JSON
def test_response_format_json_schema_gives_schema_valid_json(client):
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for temperature, seed in ((0, None), (1.0, 7)):
        answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=temperature,
                                                seed=seed, response_format=schema)
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)
    streamed = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                              response_format=schema, stream=True)
    chunks = list(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                                  response_format=schema).choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    completion = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=64, temperature=0,
                                           n=2, extra_body={"top_k": 20, "response_format": schema})
    for choice in completion.choices:
        jsonschema.validate(json.loads(choice.text), PERSON)


def test_a_pydantic_model_through_the_sdks_parse(client):
    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=10)
        age: int = pydantic.Field(ge=0, le=120)
        mood: Literal["glad", "sad", "wroth"]

    answer = client.chat.completions.parse(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                           response_format=Person)
    assert isinstance(answer.choices[0].message.parsed, Person)


def test_json_object_and_schema_text(client):
    quote, close = 2, 93  # '"' and '}' in the shipped vocabulary: the model's keys otherwise run on for ever
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                            response_format={"type": "json_object"},
                                            logit_bias={str(quote): 20, str(close): 20})
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    as_text = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=64, temperature=0,
                                        extra_body={"structured_outputs": {"json": json.dumps(PERSON)}})
    jsonschema.validate(json.loads(as_text.choices[0].text), PERSON)


# ----------------------------------------------------------------------------------------------- vLLM's field
def test_regex_choice_and_grammar_through_structured_outputs(client):
    wanted = {"regex": (EMAIL, lambda t: re.fullmatch(EMAIL, t)),
              "choice": (["ay", "nay", "perchance"], lambda t: t in ("ay", "nay", "perchance")),
              "grammar": (GRAMMAR, lambda t: re.fullmatch(r"(ay|nay) [0-9][0-9]?", t))}
    for kind, (spec, valid) in wanted.items():
        extra = {"structured_outputs": {kind: spec}}
        for seed in (1, 2):
            completion = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=32, temperature=1.0,
                                                   seed=seed, extra_body=extra)
            assert valid(completion.choices[0].text) and completion.choices[0].finish_reason == "stop", kind
        answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=32, temperature=0,
                                                extra_body=extra)
        assert valid(answer.choices[0].message.content), kind
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt="ROMEO:", max_tokens=32, temperature=0, extra_body=extra, stream=True))
        assert valid(streamed), kind
    options = {"json_object": True, "disable_additional_properties": False, "disable_any_whitespace": False}
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                            logit_bias={"2": 20, "93": 20}, extra_body={"structured_outputs": options})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


# ----------------------------------------------------------------------------------------------- tools
def test_a_named_tool_choice_gives_a_valid_tool_call(client):
    for name in ("get_weather", "greet", "ring_bell"):
        choice = {"type": "function", "function": {"name": name}}
        answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                                tools=TOOLS, tool_choice=choice)
        message = answer.choices[0].message
        assert message.content is None and len(message.tool_calls) == 1 and message.tool_calls[0].function.name == name
        assert answer.choices[0].finish_reason == "stop"  # vLLM's and OpenAI's for a named function
        arguments = check_call(message.tool_calls[0])
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64, temperature=0,
                                                     tools=TOOLS, tool_choice=choice, stream=True))
        first = chunks[0].choices[0].delta
        assert first.role == "assistant" and first.tool_calls[0].id.startswith("call_")
        assert first.tool_calls[0].function.name == name and first.tool_calls[0].type == "function"
        pieces = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
        assert all(p[0].index == 0 and (p[0].id is None) == (i > 0) for i, p in enumerate(pieces))
        streamed = "".join(p[0].function.arguments for p in pieces)
        assert json.loads(streamed) == arguments and chunks[-1].choices[0].finish_reason == "stop"
        assert all(c.choices[0].delta.content is None for c in chunks)
    with client.chat.completions.stream(model=MODEL, messages=ASK, max_tokens=64, temperature=0.8, seed=3, n=2,
                                        tools=TOOLS, tool_choice={"type": "function", "function": {
                                            "name": "get_weather"}}) as stream:  # the SDK's own accumulation
        final = stream.get_final_completion()
    assert len(final.choices) == 2
    for sample in final.choices:
        check_call(sample.message.tool_calls[0])


def test_tool_choice_required_calls_one_of_the_tools(client):
    fields = dict(model=MODEL, messages=ASK, max_tokens=96, temperature=0.8, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False)
    for seed in (1, 2, 3):
        answer = client.chat.completions.create(seed=seed, **fields)
        calls = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.content is None
        assert len(calls) == 1
        check_call(calls[0])
        chunks = list(client.chat.completions.create(seed=seed, stream=True, **fields))
        streamed = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
        assert len(streamed) == 1 and streamed[0][0].function.name == calls[0].function.name
        assert json.loads(streamed[0][0].function.arguments) == json.loads(calls[0].function.arguments)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_chat_template_gets_the_tools_to_call():
    tokenizer = char_tokenizer("{% for t in tools or [] %}{{ t.function.name }};{% endfor %}{{ messages[0].content }}")
    assert render_chat(tokenizer, ASK, tools=list(TOOLS)) == "get_weather;ring_bell;greet;Who art thou?"
    assert render_chat(tokenizer, ASK) == "Who art thou?"


def test_required_gathers_the_functions_definitions_at_the_root():
    def tool(name: str, parameters: dict) -> dict:
        return {"type": "function", "function": {"name": name, "parameters": parameters}}

    city = {"$defs": {"City": {"enum": ["Rome", "Paris"]}}, "type": "object",
            "properties": {"at": {"$ref": "#/$defs/City"}}, "required": ["at"]}
    calling = parse_tools({"tools": [tool("a", city), tool("b", city)], "tool_choice": "required",
                           "parallel_tool_calls": False})
    schema = calling.schema()
    assert schema["$defs"] == city["$defs"] and schema["maxItems"] == 1
    assert [b["properties"]["name"] for b in schema["items"]["anyOf"]] == [{"const": "a"}, {"const": "b"}]
    jsonschema.validate([{"name": "b", "parameters": {"at": "Rome"}}], schema)
    other = city | {"$defs": {"City": {"enum": ["Verona"]}}}
    for tools, words in (([tool("a", city), tool("b", other)], "define $defs.City twice"),
                         ([tool("a", {"type": "object", "properties": {"x": {"$ref": "#/properties/y"}}})],
                          "must point into $defs")):
        with pytest.raises(ToolError, match=re.escape(words)):
            parse_tools({"tools": tools, "tool_choice": "required"}).schema()


def test_array_items_are_found_as_their_text_arrives():
    text = '[{"name": "a", "parameters": {"s": "}]\\"{"}}, {"name": "b", "parameters": {}}]'
    items, found = ArrayItems(), []
    for i in range(0, len(text), 3):
        found += items.feed(text[i:i + 3])
    assert found == json.loads(text)


# ----------------------------------------------------------------------------------------------- refusals
SCHEMAS = [  # each refused, naming what xgrammar would have ignored
    ({"type": "string", "format": "iri"}, "format 'iri' is not supported"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "patternProperties": {"^x": {"type": "integer"}},
      "required": ["a", "x1"]}, "required names 'x1'"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "if": {}, "then": {}}, "$.if is not supported"),
    ({"type": "integer", "not": {"const": 3}}, "$.not is not supported"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}},
     "dependentRequired is not supported"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems is not supported"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, "contains is not supported"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf is supported for integers only"),
    ({"$ref": "https://example.com/person.json"}, "references inside the schema"),
    ({"allOf": [{"type": "integer"}, {"minimum": 2}]}, "allOf with 2 schemas"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "a+", "maxLength": 3}}},
     "$.properties.a.maxLength beside pattern"),
    ({"type": "string", "pattern": "(?=x)xy"}, "lookarounds"),
    ({"type": "string", "pattern": r"\Ahi"}, r"the escape \A"),
    ({"anyOf": [{"type": "string"}], "maxLength": 2}, "maxLength beside anyOf"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "branches 0 and 1 may both match"),
    ({"pattern": "a+"}, 'needs a "type"'),
    ({"type": "integer", "nullable": True}, "nullable is not supported"),
    ({"type": "object", "x-order": 1}, "x-order is not a JSON schema keyword"),
    ({"$ref": "#/examples/0", "examples": [{"type": "string", "format": "iri"}]}, "points at something that is not"),
]


def test_the_keywords_refused_are_the_ones_xgrammar_ignores():
    """Each refusal stands for a keyword xgrammar 0.2 drops: compiled with and without it, the grammar is
    the same. If a release starts applying one, this fails, and its refusal can go."""
    import xgrammar as xgr

    def ebnf(schema: dict) -> str:
        return str(xgr.Grammar.from_json_schema(json.dumps(schema | {"x": 1}), any_whitespace=False))

    integer, array = {"type": "integer"}, {"type": "array", "items": {"type": "integer"}}
    for base, keyword in ((integer, {"not": {"const": 3}}), (array, {"uniqueItems": True}),
                          (array, {"contains": {"const": 3}}), ({"type": "object"}, {"dependentRequired": {"a": []}}),
                          ({"type": "number"}, {"multipleOf": 0.5}), ({"type": "string"}, {"format": "iri"}),
                          (integer, {"if": {"const": 1}, "then": {"const": 2}}), (integer, {"nullable": True})):
        assert ebnf(base | keyword) == ebnf(base), keyword
    for schema, _ in SCHEMAS:
        with pytest.raises(ValueError):
            check_schema(schema)
    for schema in (PERSON, WEATHER, {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "x", "default": None},
                   {"$defs": {"A": {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                              "B": {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}},
                    "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}], "discriminator": {"propertyName": "k"}}):
        check_schema(schema)


def _schema(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


NAMED = {"type": "function", "function": {"name": "get_weather"}}
BAD = [  # (extra fields, param, words): each a 400 before anything is queued
    *[(_schema(schema), "response_format", words) for schema, words in SCHEMAS],
    (_schema({"type": "integer", "minimum": 1.5}), "response_format", "Integer constraint must be a whole number"),
    ({"structured_outputs": {"json": '{"type": "object",'}}, "structured_outputs", "does not parse"),
    ({"structured_outputs": {"json": {"type": "string", "minLength": 5, "maxLength": 2}}}, "structured_outputs",
     "could not be compiled: minLength 5 is greater than maxLength 2"),
    ({"structured_outputs": {"regex": ""}}, "structured_outputs", "regex must be a non-empty string"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs", "The parenthesis is not closed"),
    ({"structured_outputs": {"regex": r"\bword"}}, "structured_outputs", "Word boundary is not supported"),
    ({"structured_outputs": {"regex": r"a\Z"}}, "structured_outputs", r"structured_outputs.regex: the escape \Z"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs", "grammar constraint could not be"),
    ({"structured_outputs": {"grammar": "start ::= \"a\""}}, "structured_outputs", "could not be compiled"),
    ({"structured_outputs": {"grammar": 'root ::= root "a"'}}, "structured_outputs", "allows no output at all"),
    ({"structured_outputs": {"grammar": 'root ::= "' + "a" * 100_001 + '"'}}, "structured_outputs",
     "at most 100,000 are accepted"),
    (_schema({"type": "string", "description": "x" * 300_000}), "response_format", "at most 100,000 are accepted"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "choice must be a list of non-empty strings"),
    ({"structured_outputs": {"disable_any_whitespace": False}}, "structured_outputs", "needs exactly one of"),
    ({"structured_outputs": {"json_object": True, "disable_additional_properties": True}}, "structured_outputs",
     "write additionalProperties: false into the schema"),
    ({"structured_outputs": {"choice": "ay"}}, "structured_outputs", "choice must be a list of strings"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "got regex, choice"),
    ({"structured_outputs": {"regex": "a", "backend": "outlines"}}, "structured_outputs", "backend is not a field"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs",
     "whitespace_pattern is not supported"),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, "structured_outputs",
     "one space after each ','"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs", "json_object must be true"),
    ({"structured_outputs": "a+"}, "structured_outputs", "must be an object"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}}, "structured_outputs",
     "response_format and structured_outputs both constrain the output"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}, "response_format",
     "json_schema.name must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}, "response_format",
     "json_schema.schema must be a JSON schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}}, "response_format",
     "json_schema.schema must be a JSON schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": "yes"}}},
     "response_format", "strict must be a bool"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema must be an object"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "got type 'structural_tag'"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "response_format", "response_format.schema is not"),
    ({"response_format": "json"}, "response_format", "must be {'type'"),
    ({"guided_json": PERSON}, "guided_json", 'vLLM replaced it with structured_outputs; send "structured_outputs"'),
    ({"guided_choice": ["a"]}, "guided_choice", '"structured_outputs": {"choice": ...}'),
    ({"structured_outputs": {"regex": "a+"}, "min_tokens": 2}, "min_tokens", "cannot be combined with a structured"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "the constraint decides"),
]
BAD_TOOLS = [  # chat only
    ({"tools": TOOLS}, "tool_choice", "tool_choice 'auto' (the default when tools are given) is not supported"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", "Name a function in tool_choice"),
    ({"tool_choice": NAMED}, "tool_choice", "the request has no tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice",
     "'fly', which is not among the tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "greet"}}, "tool_choice", "tool_choice must be"),
    ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice", "tool_choice must be"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}], "tool_choice": "required"}, "tools",
     "name must be 1 to 64 letters"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}], "tool_choice": "required"}, "tools",
     "tools[0] must be {'type': 'function'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "tool_choice": "required"},
     "tools", "parameters must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}], "tool_choice": "required"},
     "tools", "function.returns is not supported"),
    ({"tools": TOOLS + TOOLS[:1], "tool_choice": "required"}, "tools", "'get_weather' is given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "iri"}}}}}], "tool_choice": "required"},
     "tools", "tools[0].function.parameters: $.properties.a.format 'iri' is not supported"),
    ({"tools": TOOLS, "tool_choice": NAMED, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "tool_choice",
     "response_format and tool_choice both constrain the output"),
]


@pytest.mark.parametrize(("extra", "param", "words"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_constraints_are_400_with_the_reason(served, extra, param, words):
    for path, body in (("/v1/chat/completions", chat(extra)),
                       ("/v1/completions", {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 16} | extra)):
        response = post(served, path, body)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], (path, error)


@pytest.mark.parametrize(("extra", "param", "words"), BAD_TOOLS, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_TOOLS)])
def test_bad_tools_are_400_with_the_reason(served, extra, param, words):
    error = post(served, "/v1/chat/completions", chat(extra)).json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_tools_the_request_does_not_call_are_accepted(served, client):
    unused = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0, tools=TOOLS,
                                            tool_choice="none", parallel_tool_calls=True)
    assert unused.choices[0].message.tool_calls is None and isinstance(unused.choices[0].message.content, str)
    for fields in ({"tools": [], "tool_choice": "auto"}, {"tools": None, "tool_choice": "none"}):
        assert post(served, "/v1/chat/completions", chat(fields, max_tokens=2)).status_code == 200
    refused = post(served, "/v1/completions", {"model": MODEL, "prompt": "hi", "tools": TOOLS,
                                               "tool_choice": NAMED}).json()["error"]
    assert refused["param"] == "tools" and "tools is not supported by this server" in refused["message"]
    with pytest.raises(openai.BadRequestError) as caught:  # the SDK sees the 400 and its reason
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)
    assert caught.value.body["param"] == "tool_choice"


# ----------------------------------------------------------------------------------------------- in the engine
def test_a_constraint_that_fails_in_the_engine_ends_that_request_alone(served, client, monkeypatch):
    """A grammar whose tokens run out mid-way fails in the engine: 500 (a stream: an error event) with
    the engine's reason, while a request beside it is served, and the server keeps serving."""
    beside: list = []
    thread = threading.Thread(target=lambda: beside.append(client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=64, temperature=0, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})))
    thread.start()
    dead = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 16, "structured_outputs": {"grammar": DEAD_END}}
    response = post(served, "/v1/completions", dead)
    assert response.status_code == 500 and "failed in the engine" in response.json()["error"]["message"]
    streamed = events(post(served, "/v1/completions", dead | {"stream": True}))
    assert streamed[-1] == "[DONE]" and "failed in the engine" in streamed[-2]["error"]["message"]
    thread.join()
    jsonschema.validate(json.loads(beside[0].choices[0].message.content), PERSON)

    async def passes(self, constraint):  # the server's own check skipped: the grammar reaches the engine
        return None

    monkeypatch.setattr(GrammarCheck, "check", passes)
    response = post(served, "/v1/completions", dead | {"structured_outputs": {"grammar": "root ::= ("}})
    message = response.json()["error"]["message"]
    assert response.status_code == 500 and "grammar constraint could not be compiled" in message
    monkeypatch.undo()
    assert httpx.get(served.url + "/health").status_code == 200
    answer = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=16,
                                       extra_body={"structured_outputs": {"choice": ["ay", "nay"]}})
    assert answer.choices[0].text in ("ay", "nay")


def test_the_thread_mode_server_applies_constraints_and_a_byte_tokenizer_refuses_them(model):
    shipped = LLMEngine(minillm.load_model(), minillm.load_tokenizer(), CONFIG)
    server = _Server(build_app(AsyncLLM(engine=shipped), MODEL))
    try:
        answer = post(server, "/v1/chat/completions", chat(_schema(PERSON)))
        jsonschema.validate(json.loads(answer.json()["choices"][0]["message"]["content"]), PERSON)
        assert post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "structured_outputs": {
            "grammar": 'root ::= root "a"'}}).json()["error"]["param"] == "structured_outputs"
    finally:
        server.stop()
    engine = LLMEngine(model, ByteTokenizer(), _config(model))
    server = _Server(build_app(AsyncLLM(engine=engine), MODEL))
    try:
        error = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "structured_outputs": {
            "regex": "a+"}}).json()["error"]
        assert error["param"] == "structured_outputs" and "structured outputs are unavailable" in error["message"]
        assert post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        server.stop()
