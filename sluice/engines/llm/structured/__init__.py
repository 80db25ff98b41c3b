"""Structured output: constrain a request's answer to a JSON Schema, a regex, a choice or a grammar.

``spec`` (what the answer must look like) and ``backend`` (the contract with a grammar library) are light;
the library itself (llguidance by default, xgrammar pluggable) is imported only when a grammar is compiled.
"""

from sluice.engines.llm.structured.backend import GrammarError
from sluice.engines.llm.structured.spec import StructuredOutput

__all__ = ["GrammarError", "StructuredOutput"]
