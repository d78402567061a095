"""A code's explanation as text: the entry ``tvp explain CODE`` prints and an editor's hover
shows (``trainverify_dsl.lsp``).

Header ``TVP203 unknown-mesh-axis (error)``, the summary, then the sections "What it does",
"Why is this bad" (wrapped to ``WRAP`` columns), "Example", "Use instead" (snippets as
written), each body indented by ``INDENT``.
"""

from __future__ import annotations

import textwrap

from trainverify_dsl.report.diagnostics import Code

WRAP = 88
INDENT = "    "


def explain(code: Code) -> str:
    sections = [
        f"{code.id} {code.name} ({code.severity.value})",
        code.summary,
        _section("What it does", _wrap(code.what)),
        _section("Why is this bad", _wrap(code.why)),
        _section("Example", _snippet(code.example)),
        _section("Use instead", _snippet(code.fix)),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _section(title: str, body: str) -> str:
    return f"{title}\n{body}"


def _wrap(text: str) -> str:
    paragraphs = [p for p in text.strip().split("\n\n") if p.strip()]
    return "\n\n".join(textwrap.fill(" ".join(p.split()), WRAP, initial_indent=INDENT,
                                     subsequent_indent=INDENT) for p in paragraphs)


def _snippet(text: str) -> str:
    return textwrap.indent(text.strip("\n"), INDENT)
