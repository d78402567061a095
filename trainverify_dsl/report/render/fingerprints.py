"""Fingerprints of SARIF results: what keeps one code-scanning alert per finding across runs.

A result's ``partialFingerprints`` hold two keys, neither with a line or column number, so a
finding keeps its fingerprints when lines are inserted or removed above it:

``primaryLocationLineHash``
    The key GitHub code scanning identifies an alert by, together with the rule and the file
    path. Its value is the one GitHub's ``upload-sarif`` action computes from the checked-out
    file for a result that has none (``line_hashes``): a rolling hash of the 100 characters
    from the start of the result's line, spaces and tabs left out (the line and what follows
    it), then ``:N``, the how-many-th time that hash occurs from the top of the file. Computed
    here, the same value reaches GitHub whichever way the log is uploaded: through the action
    (which finds its own value already there and says nothing) or through the REST API (which
    computes none, and would open the alerts again on every upload).
``tvp/v1`` (``FINGERPRINT_KEY``)
    Ours, for any SARIF consumer: SHA-256 of the code, the file's URI, the offending line's
    text with its whitespace collapsed, and the result's rank among results with those three
    (two identical lines get two fingerprints). Unlike GitHub's it does not change when the
    lines below the finding are edited. Versioned: a change of recipe is a new key.

A code that must not quote its file (``Code.quotes_source`` false: TVP110, a file that is not
a plan, such as a ``.env`` reached through ``use``) hashes none of the file's text: ``tvp/v1``
rests on the message, and there is no ``primaryLocationLineHash``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.render import SourceLookup

FINGERPRINT_KEY = "tvp/v1"
LINE_HASH_KEY = "primaryLocationLineHash"

#: the rolling hash of ``line_hashes``: characters per window, multiplier, 64-bit arithmetic
BLOCK_SIZE = 100
_BASE = 37
_MASK = (1 << 64) - 1
_BASE_POWER = pow(_BASE, BLOCK_SIZE, 1 << 64)  # removes the character leaving the window
_TAB, _LF, _CR, _SPACE = 0x09, 0x0A, 0x0D, 0x20
_END_OF_FILE = 0xFFFF  # fed once after the last character


def add_fingerprints(results: Sequence[dict[str, Any]], diagnostics: Sequence[Diagnostic],
                     sources: SourceLookup) -> None:
    """Set ``partialFingerprints`` on each result (``results[i]`` renders ``diagnostics[i]``)."""
    texts = _Texts(sources)
    ranks: dict[tuple[str, str, str], int] = {}
    for result, diagnostic in zip(results, diagnostics, strict=True):
        location = result["locations"][0]["physicalLocation"]
        line = location["region"]["startLine"]
        quotes = diagnostic.code.quotes_source
        content = texts.line(diagnostic.span.file, line) if quotes else None
        if content is None:  # nothing to anchor to, or not to be hashed: the message
            content = "message:" + diagnostic.message
        key = (diagnostic.code.id, location["artifactLocation"]["uri"], " ".join(content.split()))
        rank = ranks.get(key, 0)
        ranks[key] = rank + 1
        prints = {FINGERPRINT_KEY: _sha256("\0".join((*key, str(rank))))}
        line_hash = texts.line_hash(diagnostic.span.file, line) if quotes else None
        if line_hash is not None:
            prints[LINE_HASH_KEY] = line_hash
        result["partialFingerprints"] = prints


class _Texts:
    """Each file's lines and line hashes, read and computed once."""

    def __init__(self, sources: SourceLookup) -> None:
        self.sources = sources
        self.lines: dict[str, list[str] | None] = {}
        self.hashes: dict[str, list[str] | None] = {}

    def line(self, file: str, line: int) -> str | None:
        if file not in self.lines:
            text = self.sources(file)
            self.lines[file] = text.split("\n") if text is not None else None
        return _at(self.lines[file], line)

    def line_hash(self, file: str, line: int) -> str | None:
        if file not in self.hashes:
            text = self.sources(file)
            self.hashes[file] = line_hashes(text) if text is not None else None
        return _at(self.hashes[file], line)


def _at(items: list[str] | None, line: int) -> str | None:
    return items[line - 1] if items is not None and 1 <= line <= len(items) else None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def line_hashes(text: str) -> list[str]:
    """GitHub's ``primaryLocationLineHash`` of every line of ``text`` (item 0: line 1).

    The algorithm of codeql-action's ``src/fingerprints.ts``: UTF-16 code units; spaces and
    tabs skipped; CR and CRLF read as LF; each line's hash is the rolling hash (base 37, modulo
    2**64) of the ``BLOCK_SIZE`` characters from the line's first one, the end of the file
    marked by 0xFFFF and padded with zeros; written in lowercase hex without leading zeros,
    with ``:N`` counting equal hashes from the top."""
    hasher = _LineHasher()
    units = memoryview(text.encode("utf-16-le")).cast("H")
    for unit in units:
        hasher.feed(unit)
    hasher.feed(_END_OF_FILE)
    hasher.flush()
    return hasher.hashes


class _LineHasher:
    """The rolling hash over a window of ``BLOCK_SIZE`` characters. ``starts[i]`` is true when
    the character in window slot ``i`` began a line: that line's hash is complete, and
    emitted, when the slot is about to be overwritten."""

    def __init__(self) -> None:
        self.window = [0] * BLOCK_SIZE
        self.starts = [False] * BLOCK_SIZE
        self.index = 0
        self.value = 0
        self.at_line_start = True
        self.after_cr = False
        self.seen: dict[str, int] = {}
        self.hashes: list[str] = []

    def feed(self, unit: int) -> None:
        if unit in (_SPACE, _TAB) or (self.after_cr and unit == _LF):
            self.after_cr = False
            return
        self.after_cr = unit == _CR
        if self.after_cr:
            unit = _LF
        if self.starts[self.index]:
            self._emit()
        if self.at_line_start:
            self.at_line_start = False
            self.starts[self.index] = True
        if unit == _LF:
            self.at_line_start = True
        self._roll(unit)

    def flush(self) -> None:
        """Emit the lines whose windows reach past the end, padding them with zeros."""
        for _ in range(BLOCK_SIZE):
            if self.starts[self.index]:
                self._emit()
            self._roll(0)

    def _roll(self, unit: int) -> None:
        leaving = self.window[self.index]
        self.window[self.index] = unit
        self.value = (_BASE * self.value + unit - _BASE_POWER * leaving) & _MASK
        self.index = (self.index + 1) % BLOCK_SIZE

    def _emit(self) -> None:
        digest = format(self.value, "x")
        count = self.seen.get(digest, 0) + 1
        self.seen[digest] = count
        self.hashes.append(f"{digest}:{count}")
        self.starts[self.index] = False


__all__ = ["FINGERPRINT_KEY", "LINE_HASH_KEY", "add_fingerprints", "line_hashes"]
