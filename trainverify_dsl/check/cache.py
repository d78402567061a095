"""The proof cache: a proven pair is not proven again.

A proof is a fact about one ``CheckPair`` and the code that proved it, so the key is a
SHA-256 of both: the pair's contents (the reference ``Program``, the ``ParallelProgram``, the
recipe, the integer inputs and the drawn witness of any ordering, serialised with ``pickle``
— every field, so a change anywhere is a different key) and the checker's fingerprint (the
package version, the z3 version and the source text of ``check/`` and ``ir/``, the code a
proof runs through). Source positions are left out of the key (every ``Span`` and every
element's ``Source``, with its template-expansion notes, pickles as one placeholder): where a
statement stands says where to report, not what is proven, so a plan given as text (a new
temporary file each time), moved to another folder, or edited only in its comments and line
breaks meets its proof again. Only ``proven`` results are stored: a
counterexample comes from the numeric pre-check, which runs every time, and an inconclusive
one may be decided with a larger limit. An entry that cannot be read is a miss.

Granularity: the whole step is one stage today (docs/checking.md), so an edit that changes
the program misses the cache; unchanged plans (a CI re-run, the same variant met twice in a
search) are not proven again.

Where: ``$TVP_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainverify_dsl/proofs``, else
``~/.cache/trainverify_dsl/proofs``; ``tvp check --no-cache`` neither reads nor writes it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from trainverify_dsl.ir.parallel import Source
from trainverify_dsl.report.span import Span

#: the format of an entry; part of the fingerprint
FORMAT = 4
#: the counts of a ``Proof`` an entry keeps (``merged_orders`` as 0 or 1: an assumption the
#: verdict states)
FIELDS = ("elements", "by_normal_form", "by_expansion", "by_solver", "assumed_orders",
          "stages", "merged", "by_symmetry", "merged_orders")


def default_dir() -> Path:
    if os.environ.get("TVP_CACHE_DIR"):
        return Path(os.environ["TVP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainverify_dsl" / "proofs"


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """The checker's identity: version, z3's version, the source of ``check/`` and ``ir/``."""
    from importlib import metadata

    try:
        version = metadata.version("trainverify_dsl")
    except metadata.PackageNotFoundError:
        version = "?"
    digest = hashlib.sha256(f"trainverify_dsl {version} format {FORMAT}".encode())
    try:
        digest.update(f" z3 {metadata.version('z3-solver')}".encode())
    except metadata.PackageNotFoundError:
        digest.update(b" z3 ?")
    package = Path(__file__).resolve().parents[1]
    for folder in ("check", "ir"):
        for path in sorted((package / folder).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _arrays(values: Any) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    if values is None:
        return []
    out = []
    for name in sorted(values):
        array = np.ascontiguousarray(values[name])
        out.append((name, str(array.dtype), array.shape, array.tobytes()))
    return out


class _WithoutSpans(pickle.Pickler):
    """Pickles every ``Span`` and every ``Source`` (a span, the statement's span and the
    template-expansion notes, which name files) as one placeholder: the key ignores where
    statements stand."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (Span, Source)):
            return str, ("<source>",)
        return NotImplemented


def key(pair: Any) -> str:
    """The cache key of a ``check.pair.CheckPair``."""
    digest = hashlib.sha256(fingerprint().encode())
    content = (pair.reference, pair.program, pair.recipe,
               sorted(pair.inputs.items()), _arrays(pair.known), _arrays(pair.witness))
    buffer = io.BytesIO()
    _WithoutSpans(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(content)
    digest.update(buffer.getvalue())
    return digest.hexdigest()


def load(directory: Path, name: str) -> dict[str, int] | None:
    """The counts of a proven pair, or ``None`` (absent, unreadable or not a proof)."""
    try:
        entry = json.loads((directory / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("status") != "proven" \
            or entry.get("key") != name:
        return None
    counts = {f: entry.get(f) for f in FIELDS}
    if not all(isinstance(v, int) and v >= 0 for v in counts.values()):
        return None
    return counts  # type: ignore[return-value]


def store(directory: Path, name: str, proof: Any) -> bool:
    """Write a proven ``Proof``'s counts under ``name`` (atomically); ``False`` when the
    directory cannot be written (the cache is an optimisation, never an error)."""
    if proof.status != "proven":
        return False
    entry = {"key": name, "status": "proven", **{f: int(getattr(proof, f)) for f in FIELDS}}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(temp, directory / f"{name}.json")
    except OSError:
        return False
    return True
