"""The fields that ask for a structured output (chapter 11), checked and made into one `StructuredOutput`.

    response_format     {"type": "text"}                  nothing asked (OpenAI's default)
                        {"type": "json_object"}           any JSON object
                        {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}
    structured_outputs  vLLM's (the openai SDK sends it in extra_body): exactly one of json (a schema, or its
                        text), regex, choice (a list of strings), grammar (xgrammar's EBNF, start rule `root`),
                        json_object: true; beside it, disable_any_whitespace and
                        disable_additional_properties only when false (vLLM 0.32 reads neither per request:
                        they are its server's settings)
    tools, tool_choice  chat: a function's arguments (minillm/server/tools.py)

At most one of them may constrain a request. A schema or a regex is checked against what the grammar
library applies (minillm/structured/schema_support.py) here, with the body; compiling it waits for app.py, which
does it off the event loop before the request is queued. What this server refuses in
structured_outputs, and why:

    disable_any_whitespace: true   vLLM's setting writes JSON with no whitespace at all; this server's
                                   has one space after each ',' and ':' (xgrammar's compact form)
    disable_additional_properties: true
                                   an object schema with properties gets no others here anyway, but
                                   one without (json_object, {"type": "object"}) may get any
    whitespace_pattern             a regex for the whitespace between JSON tokens: not applied
    structural_tag                 not supported
    json_object: false             not a constraint (vLLM counts it as one; leave it out)

vLLM's older guided_json, guided_regex, guided_choice and guided_grammar are gone from vLLM (0.32
ignores them, with a warning); this server refuses them, pointing at structured_outputs (protocol.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from minillm.server.tools import ToolCalling, ToolError, parse_tools
from minillm.structured import StructuredOutput
from minillm.structured.schema_support import check_regex, check_schema

SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for response_format.json_schema.name
KINDS = ("json", "regex", "choice", "grammar", "json_object")
OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern", "structural_tag")


class ConstraintError(ValueError):
    """A malformed constraint: a 400 naming `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """What the output must match, and the field that asked for it (a 400 about it names that field)."""

    output: StructuredOutput
    field: str


def requested(body: dict, chat: bool) -> tuple[Constraint | None, ToolCalling | None]:
    """The request's constraint (None: none) and, for a chat that must call a function, its tools."""
    try:
        calling = parse_tools(body) if chat else None
    except ToolError as err:
        raise ConstraintError(str(err), err.param) from None
    asked = [(field, value) for field, value in (("response_format", _response_format(body.get("response_format"))),
                                                 ("structured_outputs", _structured_outputs(body)))
             if value is not None]
    if calling is not None:
        try:
            asked.append(("tool_choice", {"json": calling.schema()}))
        except ToolError as err:
            raise ConstraintError(str(err), err.param) from None
    if len(asked) > 1:
        raise ConstraintError(f"{asked[0][0]} and {asked[1][0]} both constrain the output: send one of them",
                              asked[1][0])
    if not asked:
        return None, calling
    field, fields = asked[0]
    where = "tools" if field == "tool_choice" else field
    try:
        output = StructuredOutput(**fields)
    except ValueError as err:
        raise ConstraintError(f"{where}: {err}", where) from None
    if calling is not None:  # each function's parameters on their own: a refusal names the function
        for i, tool in enumerate(calling.tools):
            name = tool["function"]["name"]
            if calling.function in (None, name):
                _check(check_schema, calling.parameters(name), f"tools[{i}].function.parameters: ", where)
    elif output.kind == "json":
        label = "response_format.json_schema.schema" if field == "response_format" else f"{field}.json"
        _check(check_schema, output.json, f"{label}: ", where)
    elif output.kind == "regex":
        _check(functools.partial(check_regex, where=f"{field}.regex"), output.regex, "", where)
    return Constraint(output, where), calling


def _check(check, value: object, label: str, param: str) -> None:
    try:
        check(value)
    except ValueError as err:
        raise ConstraintError(f"{label}{err}", param) from None


def _response_format(value: object) -> dict | None:
    """OpenAI's response_format -> StructuredOutput's fields (None: plain text)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        what = f"type {kind!r}" if isinstance(kind, str) else repr(value)[:80]
        raise ConstraintError(f"response_format must be {{'type': 'text' | 'json_object' | 'json_schema', ...}}, "
                              f"got {what}", "response_format")
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    if set(value) - allowed:
        raise ConstraintError(f"response_format.{sorted(set(value) - allowed)[0]} is not a field of a {kind!r} "
                              "response_format", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ConstraintError("response_format.json_schema must be an object {'name', 'schema', 'strict'?, "
                              f"'description'?}}, got {repr(spec)[:80]}", "response_format")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise ConstraintError(f"response_format.json_schema.{unknown[0]} is not supported", "response_format")
    if not isinstance(spec.get("name"), str) or not SCHEMA_NAME.fullmatch(spec["name"]):
        raise ConstraintError("response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-', got "
                              f"{repr(spec.get('name'))[:80]}", "response_format")
    if not isinstance(spec.get("schema"), dict):
        raise ConstraintError(f"response_format.json_schema.schema must be a JSON schema (an object), got "
                              f"{repr(spec.get('schema'))[:80]}", "response_format")
    for key, kind_of in (("strict", bool), ("description", str)):
        if spec.get(key) is not None and not isinstance(spec[key], kind_of):
            raise ConstraintError(f"response_format.json_schema.{key} must be a {kind_of.__name__}, got "
                                  f"{repr(spec[key])[:80]}", "response_format")
    return {"json": spec["schema"]}  # strict or not, the schema is enforced


def _structured_outputs(body: dict) -> dict | None:
    """vLLM's structured_outputs -> StructuredOutput's fields (None: the field is absent)."""
    value = body.get("structured_outputs")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConstraintError(f"structured_outputs must be an object, got {repr(value)[:80]}", "structured_outputs")
    unknown = sorted(set(value) - set(KINDS) - set(OPTIONS))
    if unknown:
        raise ConstraintError(f"structured_outputs.{unknown[0]} is not a field this server knows (it knows "
                              f"{', '.join(KINDS + OPTIONS)})", "structured_outputs")
    for name in ("disable_any_whitespace", "disable_additional_properties"):
        if value.get(name) is not None and not isinstance(value[name], bool):
            raise ConstraintError(f"structured_outputs.{name} must be true or false", "structured_outputs")
    if value.get("disable_any_whitespace"):
        raise ConstraintError("structured_outputs.disable_any_whitespace: true is not supported: this server's JSON "
                              "has one space after each ',' and ':' (and no other whitespace between its tokens)",
                              "structured_outputs")
    if value.get("disable_additional_properties"):
        raise ConstraintError("structured_outputs.disable_additional_properties: true is not supported: an object "
                              "schema that lists properties gets no others here, but one that lists none may get "
                              "any (write additionalProperties: false into the schema)", "structured_outputs")
    for name in ("whitespace_pattern", "structural_tag"):
        if value.get(name) is not None:
            raise ConstraintError(f"structured_outputs.{name} is not supported by this server", "structured_outputs")
    if value.get("json_object") is not None and value["json_object"] is not True:
        raise ConstraintError("structured_outputs.json_object must be true (or left out)", "structured_outputs")
    given = {kind: value[kind] for kind in KINDS if value.get(kind) is not None}
    if len(given) != 1:
        raise ConstraintError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got "
                              f"{', '.join(given) or 'none'}", "structured_outputs")
    (kind, spec), = given.items()
    if kind == "choice" and not isinstance(spec, list):
        raise ConstraintError(f"structured_outputs.choice must be a list of strings, got {repr(spec)[:80]}",
                              "structured_outputs")
    if kind in ("regex", "grammar") and not isinstance(spec, str):
        raise ConstraintError(f"structured_outputs.{kind} must be a string, got {repr(spec)[:80]}",
                              "structured_outputs")
    return {kind: spec}
