"""The one registry of diagnostic codes.

Codes are data. Each pipeline stage owns one table module (a tuple ``CODES`` of ``Code``),
with its own id range so stable ids never collide:

    TVP1xx  syntax           report/codes_syntax.py   (parse/)
    TVP2xx  plan semantics   report/codes_plan.py     (plan/)
    TVP3xx  spec tracing     report/codes_spec.py     (spec/)
    TVP4xx  lowering/layout  report/codes_lower.py    (lower/)
    TVP5xx  running a plan   report/codes_run.py      (simulate/, later check/)
    TVP6xx  importing plans  report/codes_import.py   (importers/: `tvp import`)

Look codes up by id or name with ``lookup``; never build a ``Code`` outside a table.
"""

from __future__ import annotations

from trainverify_dsl.report import (
    codes_import,
    codes_lower,
    codes_plan,
    codes_run,
    codes_spec,
    codes_syntax,
)
from trainverify_dsl.report.diagnostics import Code

ALL_CODES: tuple[Code, ...] = (codes_syntax.CODES + codes_plan.CODES + codes_spec.CODES +
                               codes_lower.CODES + codes_run.CODES + codes_import.CODES)


def _index() -> dict[str, Code]:
    index: dict[str, Code] = {}
    for code in ALL_CODES:
        for key in (code.id, code.name):
            assert key not in index, f"duplicate diagnostic code key {key!r}"
            index[key] = code
    return index


_BY_KEY = _index()


def lookup(key: str) -> Code | None:
    """The code with this id (``TVP101``, case-insensitive) or name (``unexpected-token``)."""
    return _BY_KEY.get(key) or _BY_KEY.get(key.upper())
