"""``tvp explain CODE`` and ``tvp explain --list``: the code registry, for humans.

``CODE`` is an id (``TVP203``) or a name (``unknown-mesh-axis``), case-insensitive. The
entry prints: header ``TVP203 unknown-mesh-axis (error)``, the summary, then the sections
"What it does", "Why is this bad", "Example", "Use instead". An unknown code prints
``did you mean`` suggestions on stderr and exits 2. ``--list`` prints one aligned row per
code: id, name, severity, summary. The entry's text is built by ``report/render/explain.py``
(an editor's hover shows the same text, ``trainverify_dsl.lsp``).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

from trainverify_dsl.report.diagnostics import Code
from trainverify_dsl.report.render.explain import WRAP as WRAP
from trainverify_dsl.report.render.explain import explain

EXIT_OK = 0
EXIT_USAGE = 2
CUTOFF = 0.6
TIE_MARGIN = 0.05


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("code", nargs="?", metavar="CODE",
                        help="a code id (TVP203) or name (unknown-mesh-axis)")
    parser.add_argument("--list", action="store_true", help="list every code")


def run(args: argparse.Namespace) -> int:
    from trainverify_dsl.report.codes import ALL_CODES

    if args.list:
        sys.stdout.write(code_table(ALL_CODES))
        return EXIT_OK
    if not args.code:
        print("tvp explain: give a CODE (id or name) or --list", file=sys.stderr)
        return EXIT_USAGE
    code = find_code(args.code, ALL_CODES)
    if code is None:
        print(unknown_code_message(args.code, ALL_CODES), file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(explain(code))
    return EXIT_OK


def find_code(key: str, codes: Sequence[Code]) -> Code | None:
    wanted = key.strip().lower()
    return next((c for c in codes if wanted in (c.id.lower(), c.name.lower())), None)


def suggestions(key: str, codes: Sequence[Code], limit: int = 3) -> list[Code]:
    """The codes whose id or name is closest to ``key``: every one scoring within
    ``TIE_MARGIN`` of the best match (at most ``limit``), none below ``CUTOFF``."""
    wanted = key.strip().lower()
    scored: dict[str, tuple[float, Code]] = {}
    for code in codes:
        score = max(difflib.SequenceMatcher(None, wanted, k.lower()).ratio()
                    for k in (code.id, code.name))
        if score >= CUTOFF:
            scored[code.id] = (score, code)
    ranked = sorted(scored.values(), key=lambda pair: -pair[0])
    if not ranked:
        return []
    best = ranked[0][0]
    return [code for score, code in ranked if score >= best - TIE_MARGIN][:limit]


def unknown_code_message(key: str, codes: Sequence[Code]) -> str:
    message = f"tvp explain: unknown code {key!r}"
    close = suggestions(key, codes)
    if close:
        message += "; did you mean " + " or ".join(f"{c.id} ({c.name})" for c in close) + "?"
    return message + "\n(tvp explain --list shows every code)"


def code_table(codes: Sequence[Code]) -> str:
    rows = [("ID", "NAME", "SEVERITY", "SUMMARY")]
    rows += [(c.id, c.name, c.severity.value, c.summary) for c in codes]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
             + "  " + row[3] for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"
