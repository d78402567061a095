"""``tvp import``: foreign parallel plans -> canonical `.tvp` plans (docs/importers.md).

One module per format reads its file as data (``source.py``: JSON with positions, Python
literals through ``ast``; foreign code is never run or imported), maps its module names onto
a reference model (``models.py``) and fills a ``PlanDraft`` with one transcription per
foreign construct; ``emit.py`` writes the draft as one template per kind of layer and a loop
over the layers, formats it and lints it. What cannot be transcribed exactly is refused with
a TVP6xx diagnostic at the foreign file's key or line, never approximated.

No torch and no solver: like ``tvp lint``, importing runs in milliseconds.

Public API: ``FORMATS`` (name -> ``Format``), ``import_file(format, path, options)`` ->
``ImportResult``, ``ImportOptions``, ``load_config``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainverify_dsl.importers.common import ImportOptions, Refusals, Refused
from trainverify_dsl.importers.emit import PlanDraft, emit
from trainverify_dsl.importers.models import UnknownConfig, load_config
from trainverify_dsl.report.diagnostics import Diagnostic

__all__ = ["FORMATS", "Format", "ImportOptions", "ImportResult", "UnknownConfig",
           "import_file", "load_config"]

Importer = Callable[[str, ImportOptions, Refusals], PlanDraft]


@dataclass(frozen=True, slots=True)
class Format:
    summary: str
    #: ImportOptions fields that must be given (the format does not state them)
    required: tuple[str, ...]
    load: Callable[[], Importer]


def _hf() -> Importer:
    from trainverify_dsl.importers.hf import import_hf

    return import_hf


def _torchtitan() -> Importer:
    from trainverify_dsl.importers.torchtitan import import_torchtitan

    return import_torchtitan


def _galvatron() -> Importer:
    from trainverify_dsl.importers.galvatron import import_galvatron

    return import_galvatron


def _nnscaler() -> Importer:
    from trainverify_dsl.importers.nnscaler import import_nnscaler

    return import_nnscaler


FORMATS: dict[str, Format] = {
    "hf": Format("Hugging Face base_model_tp_plan / base_model_pp_plan (JSON or "
                 "configuration_*.py)", ("batch", "mesh"), _hf),
    "torchtitan": Format("a torchtitan / DTensor parallelize_module plan (JSON or a Python "
                         "file of dict literals)", ("batch", "mesh"), _torchtitan),
    "galvatron": Format("a Galvatron hybrid-parallel strategy JSON", (), _galvatron),
    "nnscaler": Format("an nnScaler AutoDist plan JSON, with its operator table (--ops)",
                       ("batch", "ops"), _nnscaler),
}


@dataclass(frozen=True, slots=True)
class ImportResult:
    """``text`` is the canonical plan; without it, ``refusals`` say why the foreign plan was
    refused, or ``internal`` describes an importer bug (a draft that does not lint)."""

    text: str | None
    refusals: tuple[Diagnostic, ...] = ()
    internal: tuple[Diagnostic, ...] = ()
    draft_text: str = ""


def import_file(format_name: str, path: str, options: ImportOptions,
                display: str = "<imported>.tvp") -> ImportResult:
    """Import ``path`` in format ``format_name``; ``display`` names the plan in the lint
    diagnostics of an internal error."""
    refusals = Refusals(path)
    try:
        draft = FORMATS[format_name].load()(path, options, refusals)
    except Refused:
        return ImportResult(None, _in_order(refusals.items))
    if refusals:
        return ImportResult(None, _in_order(refusals.items))
    emitted = emit(draft, display)
    if emitted.text is None:
        return ImportResult(None, (), emitted.problems, emitted.draft_text)
    return ImportResult(emitted.text)


def _in_order(diagnostics: list[Diagnostic]) -> tuple[Diagnostic, ...]:
    return tuple(sorted(diagnostics, key=lambda d: (d.span.line, d.span.col)))
