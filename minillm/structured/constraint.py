"""What a request's output must be: exactly one of a JSON schema, any JSON object, a regular
expression, a choice among strings, or a grammar — refused with a clear error when malformed.

Each constraint has a `key`, the same for equal constraints however they were written (a schema's
keys in any order): compiled grammars are cached under it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_TEXT_CHARS = 100_000  # a schema, regex or grammar longer than this is refused before compiling


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
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as err:
                    raise ValueError(f"json must be a JSON schema; its text does not parse: {err}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"json must be a JSON schema (an object), got {type(schema).__name__}")
            object.__setattr__(self, "json", schema)
        for kind in ("regex", "grammar"):
            value = getattr(self, kind)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) and c for c in self.choice) \
                    or not self.choice:
                raise ValueError(f"choice must be a list of non-empty strings, got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
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
            unknown = sorted(set(value) - set(KINDS))
            if unknown:
                raise ValueError(f"structured output fields are {', '.join(KINDS)}; got {', '.join(unknown)}")
            return cls(**value)
        raise ValueError(f"structured must be a StructuredOutput or a dict of its fields, got {type(value).__name__}")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if kind != "json_object" and getattr(self, kind) is not None) \
            if not self.json_object else "json_object"

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): equal for equal constraints (a schema's keys sorted)."""
        kind = self.kind
        if kind == "json":
            return kind, json.dumps(self.json, sort_keys=True, separators=(",", ":"))
        if kind == "choice":
            return kind, json.dumps(self.choice)
        return kind, "" if kind == "json_object" else getattr(self, kind)
