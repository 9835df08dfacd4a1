"""Tool calls (chapter 11): a chat request that must call a function gets its arguments as JSON that
matches the function's parameters — a structured output — and the answer carries them as OpenAI's
`tool_calls`.

    tools: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}, ...]
    tool_choice: {"type": "function", "function": {"name": "f"}}   the output is f's arguments (its
                                                                   `parameters` schema; none: any object)
                 "required"                                        a JSON array of {"name", "parameters"},
                                                                   each a tool's (vLLM's shape); one or more
                 "none"                                            the tools are not used
                 "auto" (the default with tools)                   refused: deciding whether to call a tool
                                                                   needs a parser for the model's own
                                                                   tool-call format, which this engine lacks

As vLLM and OpenAI answer: a named function ends with finish_reason "stop", "required" with
"tool_calls"; "length" stays "length" (a named call then has its arguments cut short; "required"
keeps the calls that were complete). The message's content is null. Streamed, a named call's id,
type and name come with the role, then its arguments piece by piece; a "required" call comes whole
once its JSON is complete. parallel_tool_calls: false makes "required" call one function; a named
tool_choice always makes one call (true permits more, it does not ask for them).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from minillm.structured.schema_support import DEFINITIONS, local_refs

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI's reading of a function without parameters


class ToolError(ValueError):
    """A malformed tools or tool_choice field: a 400 naming `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCalling:
    """A chat request that must call: the named `function`, or (None: tool_choice "required") one or
    more of `tools` (a single one unless `parallel`)."""

    tools: tuple[dict, ...]  # as checked, and as a chat template receives them
    function: str | None
    parallel: bool = True

    def parameters(self, name: str) -> dict:
        function = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return function.get("parameters") or EMPTY_PARAMETERS

    def schema(self) -> dict:
        """The JSON schema the output must match."""
        if self.function is not None:
            return self.parameters(self.function)
        branches, definitions = [], {key: {} for key in DEFINITIONS}
        for tool in self.tools:  # each function's definitions move to the root, where its $refs point
            name = tool["function"]["name"]
            parameters = dict(self.parameters(name))
            for key in DEFINITIONS:
                for def_name, schema in (parameters.pop(key, None) or {}).items():
                    if definitions[key].get(def_name, schema) != schema:
                        raise ToolError(f"tools define {key}.{def_name} twice, differently: with tool_choice "
                                        "'required' they share one schema", "tools")
                    definitions[key][def_name] = schema
            stray = sorted(r for r in local_refs(parameters) if not r.startswith(("#/$defs/", "#/definitions/")))
            if stray:
                raise ToolError(f"tools[{name!r}].function.parameters: with tool_choice 'required' a $ref must "
                                f"point into $defs or definitions, got {stray[0]!r}", "tools")
            branches.append({"type": "object", "properties": {"name": {"const": name}, "parameters": parameters},
                             "required": ["name", "parameters"]})
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
        return schema | ({} if self.parallel else {"maxItems": 1}) | {k: v for k, v in definitions.items() if v}

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if reason == "stop" and self.function is None else reason


def parse_tools(body: dict) -> ToolCalling | None:
    """The request's tools and tool_choice, checked; None when no function is to be called."""
    tools = _tools(body.get("tools"))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError(f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    choice = body.get("tool_choice")
    if choice in (None, "none", "auto") and not tools:
        return None  # nothing to call
    if not tools:
        raise ToolError("tool_choice names a function to call, but the request has no tools", "tool_choice")
    if choice in (None, "auto"):
        raise ToolError("tool_choice 'auto' (the default when tools are given) is not supported by this server: it "
                        "has no parser for its model's own tool-call format. Name a function in tool_choice "
                        "({'type': 'function', 'function': {'name': ...}}), or send 'required' or 'none'",
                        "tool_choice")
    if choice == "none":
        return None
    if choice == "required":
        return ToolCalling(tools, None, parallel is not False)
    function = choice.get("function") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and set(choice) == {"type", "function"} and choice["type"] == "function"
            and isinstance(function, dict) and set(function) == {"name"} and isinstance(function["name"], str)):
        raise ToolError(f"tool_choice must be 'none', 'required' or {{'type': 'function', 'function': {{'name': "
                        f"str}}}}, got {_short(choice)}", "tool_choice")
    if function["name"] not in {t["function"]["name"] for t in tools}:
        raise ToolError(f"tool_choice names {function['name']!r}, which is not among the tools", "tool_choice")
    return ToolCalling(tools, function["name"], False)


def _tools(tools: object) -> tuple[dict, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ToolError(f"tools must be a list of functions, got {_short(tools)}", "tools")
    checked, names = [], set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and set(tool) <= {"type", "function"} and tool.get("type") == "function"
                and isinstance(function, dict)):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}, got {_short(tool)}",
                            "tools")
        unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError(f"tools[{i}].function.{unknown[0]} is not supported by this server", "tools")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolError(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_' or '-', got "
                            f"{_short(name)}", "tools")
        if name in names:
            raise ToolError(f"tools[{i}].function.name {name!r} is given twice", "tools")
        names.add(name)
        for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise ToolError(f"tools[{i}].function.{key} must be {'an object' if kind is dict else kind.__name__}"
                                f", got {_short(function[key])}", "tools")
        checked.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return tuple(checked)


# ----------------------------------------------------------------------------------------------- answers
def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_calls(calling: ToolCalling, text: str) -> list[dict]:
    """A whole answer's `tool_calls`: the named call with `text` as its arguments, or ("required") the
    array's complete calls."""
    if calling.function is not None:
        return [_call(calling.function, text)]
    return [_call(item["name"], _arguments(item)) for item in ArrayItems().feed(text)]


class CallStream:
    """One sample's streamed tool calls: `start()` goes with the role, `push(text)` with each piece."""

    def __init__(self, calling: ToolCalling):
        self.calling, self.items, self.count = calling, ArrayItems(), 0

    def start(self) -> list[dict] | None:
        if self.calling.function is None:
            return None
        self.count = 1
        return [{"index": 0} | _call(self.calling.function, "")]

    def push(self, text: str) -> list[dict] | None:
        if self.calling.function is not None:
            return [{"index": 0, "function": {"arguments": text}}] if text else None
        calls = []
        for item in self.items.feed(text):
            calls.append({"index": self.count} | _call(item["name"], _arguments(item)))
            self.count += 1
        return calls or None


def _call(name: str, arguments: str) -> dict:
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def _arguments(item: dict) -> str:
    return json.dumps(item.get("parameters", {}), ensure_ascii=False)


class ArrayItems:
    """The complete objects of a JSON array, as its text arrives in pieces (a "required" answer)."""

    def __init__(self):
        self.text, self.scanned, self.depth, self.start = "", 0, 0, None
        self.in_string = self.escaped = False

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        found = []
        for i in range(self.scanned, len(self.text)):
            char = self.text[i]
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (char == "\\", char != '"')
            elif char == '"':
                self.in_string = True
            elif char in "[{":
                self.depth += 1
                self.start = i if self.depth == 2 else self.start
            elif char in "]}":
                if self.depth == 2 and self.start is not None:
                    try:  # the grammar made it valid JSON
                        item = json.loads(self.text[self.start : i + 1])
                    except ValueError:
                        item = None
                    found += [item] if isinstance(item, dict) and isinstance(item.get("name"), str) else []
                    self.start = None
                self.depth -= 1
        self.scanned = len(self.text)
        return found


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
