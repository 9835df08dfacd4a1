"""Structured outputs (chapter 11): the output must match a JSON schema, a regular expression, one of
several strings or a grammar, enforced by a mask over the vocabulary at every step.

    constraint.py   what a request asks for (`StructuredOutput`), checked when it is made
    grammars.py     compiling it against the tokenizer (xgrammar), once per distinct constraint and
                    off the step loop; the per-request matcher that walks the output and fills the mask
"""

from minillm.structured.constraint import StructuredOutput
from minillm.structured.grammars import GrammarCompiler, Matcher

__all__ = ["GrammarCompiler", "Matcher", "StructuredOutput"]
