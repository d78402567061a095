"""A statement at a module boundary no value crosses is an error at the statement, never
dropped (docs/semantics.md §10): a container the model never calls (`layers`, an
nn.ModuleList, itself), a module whose parameters are used directly. Before, `partial
layers.out over dp` and `all-reduce layers.in over dp` on Llama were VERIFIED."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.api import check_file

HEAD = ('plan t\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq 8\n'
        "spec-optimizer sgd lr=0.1\nmesh dp=2\nsplit tokens [dp, -]\nsplit labels [dp, -]\n")
TAIL = "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n"


@pytest.mark.parametrize("statement", ["partial layers.out over dp",
                                       "all-reduce layers.in over dp",
                                       "split layers.out [dp, -, -]"])
def test_a_boundary_no_value_crosses_is_an_error_at_the_statement(tmp_path: Path,
                                                                  statement: str) -> None:
    path = tmp_path / "p.tvp"
    path.write_text(HEAD + statement + "\n" + TAIL)
    errors = [(d.code.id, d.span.line) for d in api.layout_diagnostics(path)
              if d.severity == "error"]
    assert errors == [("TVP401", 7)], errors
    message = next(d.message for d in api.layout_diagnostics(path) if d.code.id == "TVP401")
    assert "no value crosses" in message
    verdict = check_file(path, cache=False)
    assert verdict.verdict != "verified"


def test_the_same_statement_on_a_called_block_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "p.tvp"
    path.write_text(HEAD + "split layers.1.out [dp, -, -]\n" + TAIL)
    assert [d for d in api.layout_diagnostics(path) if d.severity == "error"] == []
