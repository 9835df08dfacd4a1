"""What the grammar library would silently ignore in a JSON schema or a regex: refused by name.

xgrammar (0.2.x) turns a schema into a grammar, but some keywords it drops with at most a line on
stderr, so an output could break the schema while the client believes it was enforced. Found by
compiling each keyword with and without it (xgrammar 0.2.9):

    not, if/then/else, dependentRequired, dependentSchemas, dependencies        dropped
    contains, minContains, maxContains, uniqueItems: true, additionalItems      dropped
    multipleOf on a number, or not a whole number; a format it does not know    dropped
    minLength/maxLength beside pattern or format                                the lengths dropped
    allOf of several schemas; a $ref that is not "#/..." (a URL, an $anchor)   any JSON value
    keywords beside anyOf/oneOf/allOf/$ref (beside enum/const: all but "type")  dropped
    oneOf whose branches may overlap                                            taken as anyOf
    a `required` name that `properties` does not define                         dropped
    propertyNames beside properties                                             not applied to them
    type-specific keywords without "type" ({"pattern": ...}, {"minimum": ...})  any JSON value
    in a pattern: a lookaround; \\A, \\Z, \\z and other escapes it does not know; ^ or $ mid-way
                                                                                dropped, or literal

So the check is an allow-list: annotations (title, description, ...), and the keywords xgrammar
applies. Anything else is a ValueError naming the keyword and where it is (`$.properties.age`).
Keywords of a type the value cannot have are left alone: they do not apply to it.

The engine runs it on every JSON schema before compiling (minillm/structured/grammars.py), so a request
made through `LLM` or `AsyncLLM` fails with the reason; the server runs it first, naming the request's
field, and answers 400.
"""

from __future__ import annotations

import json

ANNOTATIONS = {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
               "discriminator"}  # discriminator (OpenAPI): pydantic's unions, whose branches carry the consts
ROOT_ONLY = {"$schema", "$id"}
DEFINITIONS = ("$defs", "definitions")
COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref", "enum", "const")
BY_TYPE = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "unevaluatedItems", "uniqueItems"},
    "object": {"properties", "required", "additionalProperties", "unevaluatedProperties", "patternProperties",
               "propertyNames", "minProperties", "maxProperties"},
    "boolean": set(), "null": set(),
}
TYPE_KEYWORDS = set().union(*BY_TYPE.values())
FORMATS = {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
           "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}
IGNORED = {  # keywords xgrammar drops, and what to do instead
    "not": "", "if": "", "then": "", "else": "", "dependentRequired": "", "dependentSchemas": "",
    "dependencies": "", "contains": "", "minContains": "", "maxContains": "",
    "additionalItems": " (use prefixItems and items)", "nullable": ' (use "type": [..., "null"])',
    "contentEncoding": "", "contentMediaType": "", "contentSchema": "",
    "$anchor": " (point $ref at #/$defs/... instead)", "$dynamicRef": "", "$dynamicAnchor": "", "$recursiveRef": "",
    "$recursiveAnchor": "", "$vocabulary": "",
}
REGEX_ESCAPES = set("dDwWsSnrtfvae0") | set("bBkpPcux123456789")  # honoured, or refused by xgrammar itself
CLASS_ESCAPES = set("dDwWsSnrtfvae0b") | set("pPcux")
MAX_REF_HOPS = 32  # a chain of $refs longer than this is not followed when telling oneOf branches apart


def check_schema(schema: object) -> None:
    """Refuse (ValueError) a JSON schema that uses anything xgrammar would not apply."""
    todo: list[tuple[object, str]] = [(schema, "$")]
    checked: set[int] = set()  # the schemas checked, by identity
    while todo:  # a loop, not recursion: a deeply nested schema must not exhaust Python's stack
        node, path = todo.pop()
        checked.add(id(node))
        todo += _check_node(node, path, schema)
    for ref in sorted(local_refs(schema)):  # one that points elsewhere ("#/examples/0") escaped the check
        target = _pointer(schema, ref)
        if isinstance(target, dict) and id(target) not in checked:
            raise ValueError(f"$ref {ref!r} points at something that is not a schema here (point it into $defs)")


def local_refs(schema: object) -> set[str]:
    """Every $ref in the schema (only where a schema is expected: not a property that happens to be
    called "$ref")."""
    refs, todo = set(), [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"])
            todo += _subschemas(node)
    return refs


def schema_patterns(schema: object) -> list[str]:
    """Every regex in the schema: its `pattern`s and `patternProperties` keys (a malformed schema is walked
    as far as it goes: nothing is checked here)."""
    patterns, todo = [], [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                patterns.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                patterns += [key for key in node["patternProperties"] if isinstance(key, str)]
            todo += _subschemas(node)
    return patterns


def check_regex(pattern: str, where: str) -> None:
    """Refuse a regex xgrammar would read otherwise than Python or JavaScript do (its lookarounds
    are dropped inside a JSON schema; an escape it does not know matches the letter itself)."""
    in_class, first, i = False, 0, 0  # first: where the open class's first member is (a "]" there is one)
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            known = CLASS_ESCAPES if in_class else REGEX_ESCAPES
            if escaped.isascii() and escaped.isalnum() and escaped not in known:
                raise ValueError(f"{where}: the escape \\{escaped} is not supported (xgrammar would match "
                                 f"{escaped!r} literally)")
            i += 2
            continue
        if in_class:
            in_class = char != "]" or i == first
        elif char == "[":
            in_class, first = True, i + 2 if pattern.startswith("[^", i) else i + 1
        elif char == "(" and pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            raise ValueError(f"{where}: lookarounds such as {pattern[i:i + 4]!r} are not supported")
        elif char == "^" and i > 0:
            raise ValueError(f"{where}: '^' is supported only at the start of the regex (xgrammar ignores it "
                             "elsewhere)")
        elif char == "$" and i < len(pattern) - 1:
            raise ValueError(f"{where}: '$' is supported only at the end of the regex (xgrammar ignores it "
                             "elsewhere)")
        i += 1


# ----------------------------------------------------------------------------------------------- one node
def _check_node(node: object, path: str, root: object) -> list[tuple[object, str]]:
    """Check one schema (not the schemas inside it); return those, with their paths."""
    if isinstance(node, bool):
        return []
    if not isinstance(node, dict):
        raise ValueError(f"{path} must be a schema (an object or a boolean), got {_short(node)}")
    for key in node:
        if key in ANNOTATIONS or key in DEFINITIONS or key == "type" or key in COMBINATORS or key in TYPE_KEYWORDS:
            continue
        if key in ROOT_ONLY:
            if path != "$":
                raise ValueError(f"{path}.{key} is supported only at the schema's root")
            continue
        if key in IGNORED:
            raise ValueError(f"{path}.{key} is not supported: xgrammar would ignore it{IGNORED[key]}")
        raise ValueError(f"{path}.{key} is not a JSON schema keyword this server applies")
    children = _definitions(node, path)
    combinators = [k for k in COMBINATORS if k in node]
    if combinators:
        return children + _check_combinator(node, path, combinators, root)
    types = _types(node, path)
    if "uniqueItems" in node and node["uniqueItems"] is not False and (types is None or "array" in types):
        raise ValueError(f"{path}.uniqueItems is not supported: xgrammar would ignore it")
    if types is None:  # xgrammar then allows any JSON value, whatever the other keywords say
        stray = sorted(k for k in node if k in TYPE_KEYWORDS and k != "uniqueItems")
        if stray:
            raise ValueError(f"{path}.{stray[0]} needs a \"type\" beside it: without one xgrammar allows any "
                             "JSON value")
        return children
    if "string" in types:
        _check_string(node, path)
    if "multipleOf" in node and ({"integer", "number"} & types):
        step = node["multipleOf"]
        if "number" in types or isinstance(step, bool) or not isinstance(step, int | float) \
                or step <= 0 or step != int(step):
            raise ValueError(f"{path}.multipleOf is supported for integers only, as a whole number > 0 "
                             f"(xgrammar would ignore it), got {_short(step)} for type {sorted(types)}")
    if "array" in types:
        children += _array_children(node, path)
    if "object" in types:
        children += _object_children(node, path)
    return children


def _types(node: dict, path: str) -> set[str] | None:
    """The types the node allows: its "type", or what xgrammar infers without one (None: any)."""
    given = node.get("type")
    if given is None:
        inferred = {t for t, keys in (("object", ("properties", "additionalProperties")),
                                      ("array", ("items", "prefixItems"))) if any(k in node for k in keys)}
        if len(inferred) > 1:
            raise ValueError(f"{path} has both object and array keywords: give it a \"type\"")
        return inferred or None
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, list) or not names or not all(isinstance(t, str) and t in BY_TYPE for t in names):
        raise ValueError(f"{path}.type must be one of {', '.join(BY_TYPE)} or a list of them, got {_short(given)}")
    return set(names)


def _check_string(node: dict, path: str) -> None:
    if "format" in node and node["format"] not in FORMATS:
        raise ValueError(f"{path}.format {_short(node['format'])} is not supported (xgrammar would ignore it); "
                         f"it knows {', '.join(sorted(FORMATS))}")
    shaped = [k for k in ("pattern", "format") if k in node]
    if len(shaped) == 2:
        raise ValueError(f"{path}: pattern beside format is not supported (xgrammar applies one of them)")
    lengths = [k for k in ("minLength", "maxLength") if k in node]
    if shaped and lengths:
        raise ValueError(f"{path}.{lengths[0]} beside {shaped[0]} is not supported: xgrammar would ignore the "
                         "length (write it into the pattern)")
    if "pattern" in node:
        if not isinstance(node["pattern"], str):
            raise ValueError(f"{path}.pattern must be a string, got {_short(node['pattern'])}")
        check_regex(node["pattern"], f"{path}.pattern")


def _array_children(node: dict, path: str) -> list[tuple[object, str]]:
    children = []
    if "items" in node:
        if isinstance(node["items"], list):
            raise ValueError(f"{path}.items as a list is not supported: use prefixItems (and items for the rest)")
        children.append((node["items"], f"{path}.items"))
    if "prefixItems" in node:
        items = node["prefixItems"]
        if not isinstance(items, list):
            raise ValueError(f"{path}.prefixItems must be a list of schemas, got {_short(items)}")
        children += [(item, f"{path}.prefixItems[{i}]") for i, item in enumerate(items)]
    if "unevaluatedItems" in node:
        children.append((node["unevaluatedItems"], f"{path}.unevaluatedItems"))
    return children


def _object_children(node: dict, path: str) -> list[tuple[object, str]]:
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise ValueError(f"{path}.properties must be an object of schemas, got {_short(properties)}")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise ValueError(f"{path}.required must be a list of property names, got {_short(required)}")
    missing = [name for name in required if name not in properties]
    if missing:
        raise ValueError(f"{path}.required names {missing[0]!r}, which {path}.properties does not define: "
                         "xgrammar would not require it")
    if "propertyNames" in node and properties:
        raise ValueError(f"{path}.propertyNames beside properties is not supported: xgrammar would not apply it "
                         "to the properties listed")
    children = [(schema, f"{path}.properties.{name}") for name, schema in properties.items()]
    patterns = node.get("patternProperties", {})
    if not isinstance(patterns, dict):
        raise ValueError(f"{path}.patternProperties must be an object of schemas, got {_short(patterns)}")
    for pattern, schema in patterns.items():
        check_regex(pattern, f"{path}.patternProperties key {pattern!r}")
        children.append((schema, f"{path}.patternProperties.{pattern}"))
    children += [(node[k], f"{path}.{k}") for k in ("additionalProperties", "unevaluatedProperties") if k in node]
    if "propertyNames" in node:  # a schema for the names: strings, whether it says so or not
        names = node["propertyNames"]
        children.append(({"type": "string"} | names if isinstance(names, dict) and "type" not in names
                         and not any(k in names for k in COMBINATORS) else names, f"{path}.propertyNames"))
    return children


def _definitions(node: dict, path: str) -> list[tuple[object, str]]:
    children = []
    for key in DEFINITIONS:
        if key in node:
            if not isinstance(node[key], dict):
                raise ValueError(f"{path}.{key} must be an object of schemas, got {_short(node[key])}")
            children += [(schema, f"{path}.{key}.{name}") for name, schema in node[key].items()]
    return children


def _check_combinator(node: dict, path: str, combinators: list[str], root: object) -> list[tuple[object, str]]:
    """anyOf, oneOf, allOf, $ref, enum or const: xgrammar applies it alone, so it must stand alone."""
    kind = combinators[0]
    allowed = ANNOTATIONS | ROOT_ONLY | set(DEFINITIONS) | ({"type"} if kind in ("enum", "const") else set())
    beside = [k for k in node if k != kind and k not in allowed]
    if beside:
        raise ValueError(f"{path}.{beside[0]} beside {kind} is not supported: xgrammar applies {kind} alone "
                         f"(move {beside[0]!r} into {'each branch' if kind.endswith('Of') else 'the schema'})")
    value = node[kind]
    if kind in ("enum", "const"):
        values = [value] if kind == "const" else value
        if not isinstance(values, list) or not values:
            raise ValueError(f"{path}.enum must be a non-empty list, got {_short(value)}")
        types = _types(node, path) if "type" in node else None
        wrong = [v for v in values if types is not None and not _json_types(v) & types]
        if wrong:
            raise ValueError(f"{path}.{kind} holds {_short(wrong[0])}, which is not of type {node['type']}: "
                                 f"xgrammar applies {kind} alone")
        return []
    if kind == "$ref":
        if not isinstance(value, str) or not (value == "#" or value.startswith("#/")):
            raise ValueError(f"{path}.$ref {_short(value)} is not supported: only references inside the schema "
                             "(\"#/$defs/...\") are; xgrammar would allow any JSON value")
        return []
    if not isinstance(value, list) or not value:
        raise ValueError(f"{path}.{kind} must be a non-empty list of schemas, got {_short(value)}")
    if kind == "allOf" and len(value) > 1:
        raise ValueError(f"{path}.allOf with {len(value)} schemas is not supported: xgrammar would allow any JSON "
                         "value (merge them into one schema)")
    if kind == "oneOf":
        for i in range(len(value)):
            for j in range(i + 1, len(value)):
                if not _disjoint(value[i], value[j], root):
                    raise ValueError(f"{path}.oneOf: branches {i} and {j} may both match a value, and xgrammar "
                                     "would then allow it (anyOf); give them different types or a property "
                                     "with different const values, or use anyOf")
    return [(branch, f"{path}.{kind}[{i}]") for i, branch in enumerate(value)]


# ----------------------------------------------------------------------------------------------- oneOf
def _disjoint(a: object, b: object, root: object) -> bool:
    """Whether no JSON value can match both schemas — proven by their types, their enum/const
    values, or a required property whose const/enum values differ (False: not proven)."""
    a, b = _resolve(a, root), _resolve(b, root)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    types_a, types_b = _possible_types(a), _possible_types(b)
    if types_a is not None and types_b is not None and not _widen(types_a) & _widen(types_b):
        return True
    values_a, values_b = _values(a), _values(b)
    if values_a is not None and values_b is not None:
        return not values_a & values_b
    props_a, props_b = _properties(a), _properties(b)
    for name in set(_required(a)) & set(_required(b)):
        tags_a, tags_b = _values(_resolve(props_a.get(name), root)), _values(_resolve(props_b.get(name), root))
        if tags_a is not None and tags_b is not None and not tags_a & tags_b:
            return True
    return False


def _resolve(schema: object, root: object) -> object:
    """The schema a local $ref points at (followed through chains), or the schema itself."""
    for _ in range(MAX_REF_HOPS):
        if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
            return schema
        schema = _pointer(root, schema["$ref"])
    return None


def _pointer(root: object, ref: str) -> object:
    node = root
    for part in ref.removeprefix("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            node = node.get(part) if isinstance(node, dict) else None
    return node


def _possible_types(node: dict) -> set[str] | None:
    values = _values(node)
    if values is not None:
        return set().union(*(_json_types(json.loads(v)) for v in values))
    given = node.get("type")
    if isinstance(given, str):
        return {given}
    if isinstance(given, list) and all(isinstance(t, str) for t in given):
        return set(given)
    return None


def _widen(types: set[str]) -> set[str]:
    return types | ({"number", "integer"} if types & {"number", "integer"} else set())


def _values(node: object) -> set[str] | None:
    """The JSON values (as canonical text) a schema allows, when it lists them (const, enum)."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return {_canonical(node["const"])}
    if isinstance(node.get("enum"), list):
        return {_canonical(v) for v in node["enum"]}
    return None


def _required(node: dict) -> list:
    required = node.get("required")
    return required if isinstance(required, list) else []


def _properties(node: dict) -> dict:
    properties = node.get("properties")
    return properties if isinstance(properties, dict) else {}


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _json_types(value: object) -> set[str]:
    """The JSON schema types a value has (a whole number is an integer and a number)."""
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    return {str: {"string"}, type(None): {"null"}, list: {"array"}, dict: {"object"}}.get(type(value), set())


def _subschemas(node: dict) -> list[object]:
    """Every schema directly inside `node` (for walks that check nothing)."""
    children = [node[k] for k in ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
                                  "propertyNames") if isinstance(node.get(k), dict)]
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            children += node[key]
    for key in ("properties", "patternProperties", *DEFINITIONS):
        if isinstance(node.get(key), dict):
            children += node[key].values()
    return children


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
