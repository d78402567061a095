"""The parse layer: `.tvp` text -> AST (``parse.ast``) with syntax diagnostics, and back.

Public API (others code against these names):

- ``parse_source(text, file="<string>") -> ParseResult``
- ``parse_file(path) -> ParseResult``
- ``read_source(path) -> (text | None, diagnostics)``: a plan file's text, read safely
- ``ParseResult(plan_file, diagnostics)``
- ``format_source(text, file="<string>") -> FormatResult``; ``format_plan(plan_file) -> str``
"""

from trainverify_dsl.parse.format import FormatResult, format_plan, format_source
from trainverify_dsl.parse.parser import ParseResult, parse_file, parse_source, read_source

__all__ = [
    "FormatResult",
    "ParseResult",
    "format_plan",
    "format_source",
    "parse_file",
    "parse_source",
    "read_source",
]
