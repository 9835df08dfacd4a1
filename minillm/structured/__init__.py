"""Structured outputs (chapter 11): the output must match a JSON schema, a regular expression, one of
several strings or a grammar, enforced by a mask over the vocabulary at every step.

    constraint.py   what a request asks for (`StructuredOutput`), checked when it is made
    schema_support.py  the JSON-schema keywords the library would silently ignore, refused by name
    backend.py      the two small interfaces the engine needs of a grammar library, and why xgrammar
    grammars.py     compiling it against the tokenizer (xgrammar), once per distinct constraint and
                    off the step loop; the per-request matcher that walks the output and fills the mask
    manager.py      the engine's side: a request waits until its grammar is compiled, gets one
                    matcher per sample, and its matcher follows every token it keeps
    step_masks.py   one step's bitmask: a row per sampling row, guesses' rows after their prefixes

The grammar library (xgrammar, which imports transformers) loads only when a constraint is first
compiled: an engine that never sees one never pays for it.
"""

from minillm.structured.constraint import StructuredOutput

__all__ = ["GrammarCompiler", "Matcher", "StructuredOutput"]


def __getattr__(name: str):
    if name in ("GrammarCompiler", "Matcher"):
        from minillm.structured import grammars

        return getattr(grammars, name)
    raise AttributeError(f"module 'minillm.structured' has no attribute {name!r}")
