"""What a request's output must be: exactly one of a JSON schema, any JSON object, a regular
expression, a choice among strings, or a grammar — refused with a clear error when malformed.

Each constraint has a `key`, the same for equal constraints however they were written (a schema's
keys in any order): compiled grammars are cached under it.
"""

from __future__ import annotations

import functools
import json
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_TEXT_CHARS = 100_000  # a schema, regex or grammar longer than this is refused before compiling
MAX_SCHEMA_DEPTH = 100  # objects and lists nested deeper in a schema are refused: the library's compile time
#                         grows with the cube of the depth (0.4 s at 200 levels, 10 s at 600), and Python's
#                         own recursion (json.dumps, pickling to the engine core) ends near 1,000


@dataclass(frozen=True, eq=False)
class StructuredOutput:
    """Set exactly one: `json` (a JSON schema, a dict or its JSON text), `json_object=True` (any JSON
    object), `regex` (the whole output matches it), `choice` (the output is one of these strings),
    `grammar` (an EBNF grammar in xgrammar's dialect, its start rule `root`). Equal constraints (by
    `key`) compare and hash equal, so `SamplingParams` holding them do too."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [kind for kind in KINDS if (getattr(self, kind) is not None and kind != "json_object")
                 or (kind == "json_object" and self.json_object is not False)]
        if len(given) != 1:
            raise ValueError(f"a structured output needs exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        if self.json_object is not False and self.json_object is not True:
            raise ValueError(f"json_object must be True or False, got {self.json_object!r}")
        if self.json is not None:
            object.__setattr__(self, "json", _schema(self.json))
        for kind in ("regex", "grammar"):
            value = getattr(self, kind)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{kind} must be a non-empty string, got {_short(value)}")
            if value is not None:
                object.__setattr__(self, kind, _text(kind, value))
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice))
        if len(self.key[1]) > MAX_TEXT_CHARS:
            raise ValueError(f"the {self.kind} is {len(self.key[1]):,} characters long; at most "
                             f"{MAX_TEXT_CHARS:,} are accepted")

    def __eq__(self, other) -> bool:
        return isinstance(other, StructuredOutput) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @classmethod
    def coerce(cls, value) -> StructuredOutput:
        """A StructuredOutput, or a dict of its fields ({"regex": "[0-9]+"}) made into one."""
        if isinstance(value, StructuredOutput):
            return value
        if isinstance(value, dict):
            unknown = sorted(repr(k) if not isinstance(k, str) else k for k in value if k not in KINDS)
            if unknown:
                raise ValueError(f"structured output fields are {', '.join(KINDS)}; got {', '.join(unknown)}")
            return cls(**value)
        raise ValueError(f"structured must be a StructuredOutput or a dict of its fields, got {type(value).__name__}")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if kind != "json_object" and getattr(self, kind) is not None) \
            if not self.json_object else "json_object"

    @functools.cached_property  # a frozen dataclass's __dict__ is still writable: computed once, kept
    def key(self) -> tuple[str, str]:
        """(kind, text): equal for equal constraints. A schema's keys keep their order: the library writes an
        object's properties in the order its schema lists them, so schemas listing them differently differ."""
        kind = self.kind
        if kind == "json":
            return kind, json.dumps(self.json, separators=(",", ":"))
        if kind == "choice":
            return kind, json.dumps(self.choice)
        return kind, "" if kind == "json_object" else getattr(self, kind)


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text(kind: str, value: str) -> str:
    """A regex's, grammar's or choice's text as a plain str, refused if it cannot be UTF-8 (a lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{kind} is not valid Unicode: {err.reason} at position {err.start} "
                         f"({value[err.start:err.end]!r})") from None
    return str(value)


def _choices(value) -> tuple[str, ...]:
    """choice as a tuple of non-empty strings: a list or tuple (any iterable but a string, bytes or a mapping)."""
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise ValueError(f"choice must be a list of non-empty strings, got {_short(value)}")
    choices = tuple(value)  # once: a generator is read here, and only here
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"choice must be a list of non-empty strings, got {_short(list(choices))}")
    return tuple(_text("choice", c) for c in choices)


def _schema(value) -> dict:
    """A JSON schema as plain JSON values (a dict): parsed from its text, or a dict checked to be JSON (string
    keys; no NaN, no infinity, no set; numpy numbers become Python's) and nested at most MAX_SCHEMA_DEPTH deep."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"json must be a JSON schema; its text does not parse: {err}") from None
        except RecursionError:
            raise ValueError(f"json: the schema is nested more than {MAX_SCHEMA_DEPTH} objects or lists deep") \
                from None
    if not isinstance(value, dict):
        raise ValueError(f"json must be a JSON schema (an object), got {type(value).__name__}")
    _check_depth(value)
    try:
        text = json.dumps(value, allow_nan=False, default=_numpy_number, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError) as err:  # UnicodeEncodeError is a ValueError
        raise ValueError(f"json must be a JSON schema made of JSON values: {err}") from None
    return json.loads(text)  # plain dicts, lists, strings, numbers: the same for every equal schema


def _numpy_number(value):
    """json.dumps's fallback: a numpy number or bool as Python's; anything else is no JSON value."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        item = value.item()
        if isinstance(item, bool | numbers.Real):
            return item
    raise TypeError(f"a {type(value).__name__} is not a JSON value")


def _check_depth(schema: dict) -> None:
    """String keys, at most MAX_SCHEMA_DEPTH levels, and (a list or dict may be held at many places) a bounded size."""
    todo, seen = [(schema, 1)], 0
    while todo:  # a loop, not recursion: a deep schema must not exhaust Python's stack here
        node, depth = todo.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"json: the schema is nested more than {MAX_SCHEMA_DEPTH} objects or lists deep")
        wrong = [key for key in node if not isinstance(key, str)] if isinstance(node, dict) else []
        if wrong:
            raise ValueError(f"json: a schema's keys must be strings, got {_short(wrong[0])}")
        children = list(node.values()) if isinstance(node, dict) else node
        seen += len(node)
        if seen > MAX_TEXT_CHARS:  # every member takes at least a character of the schema's text
            raise ValueError(f"json: the schema is longer than {MAX_TEXT_CHARS:,} characters")
        todo += [(child, depth + 1) for child in children if isinstance(child, dict | list | tuple)]


# escapes the grammar library reads as Python's re does (or refuses itself: \\b \\B \\k \\p \\P, back-references);
# any other letter it would match literally where re means something else (\\A, \\Z, \\z, \\G, \\Q...)
REGEX_ESCAPES = set("dDwWsSnrtfva0xuce") | set("bBkpP")


def _regex_atoms(pattern: str):
    """(position, text, inside a class) for each piece of `pattern`: an escape ("\\d") or one character."""
    in_class, first, i = False, 0, 0  # first: where the open class's first member is (a "]" there is one)
    while i < len(pattern):
        if pattern[i] == "\\" and i + 1 < len(pattern):
            yield i, pattern[i : i + 2], in_class
            i += 2
            continue
        char = pattern[i]
        yield i, char, in_class
        if in_class:
            in_class = char != "]" or i == first
        elif char == "[":
            in_class, first = True, i + 2 if pattern.startswith("[^", i) else i + 1
        i += 1


def _check_regex(pattern: str) -> None:
    """Refuse what the grammar library would read otherwise than Python's re (the output must fullmatch it):
    an escape it takes literally, and ^ or $ inside a sequence (it drops them; there they match nothing)."""
    atoms = list(_regex_atoms(pattern))
    texts = [atom for _, atom, in_class in atoms]
    for k, (i, atom, in_class) in enumerate(atoms):
        if len(atom) == 2 and atom[1].isascii() and atom[1].isalpha() and atom[1] not in REGEX_ESCAPES:
            raise ValueError(f"regex: the escape {atom} (position {i}) is not supported: the grammar library would "
                             f"match {atom[1]!r} literally")
        if in_class or atom not in ("^", "$"):
            continue
        if atom == "^":  # before it, only group openings back to the start or a "|"
            j = k - 1
            while j >= 0 and (texts[j] == "(" or texts[j - 2 : j + 1] == ["(", "?", ":"]):
                j -= 1 if texts[j] == "(" else 3
            alone = j < 0 or texts[j] == "|"
        else:  # after it, only group closings up to the end or a "|"
            j = k + 1
            while j < len(texts) and texts[j] == ")":
                j += 1
            alone = j == len(texts) or texts[j] == "|"
        if not alone:
            raise ValueError(f"regex: {atom!r} at position {i} is supported only at the start or end of the regex "
                             "or of an alternative (the grammar library ignores it elsewhere)")


def regex_for_library(pattern: str) -> str:
    """The pattern as the grammar library should get it, or a ValueError for what it would read otherwise than
    Python's re (checked when compiling: a server checks these itself first, in its own words): "." outside a
    class as [^\\n], which it is in re (the library's "." also matches a newline)."""
    _check_regex(pattern)
    return "".join("[^\\n]" if atom == "." and not in_class else atom for _, atom, in_class in _regex_atoms(pattern))
