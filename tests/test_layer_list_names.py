"""A module list is any path the plan indexes, whatever it is called (docs/language.md,
*Pipeline*): a user's model whose blocks are `self.blocks` gets the same pipeline checks
as one whose blocks are `self.layers` (virtual stages TVP247, overlaps TVP242, coverage
TVP245), and a list's real length comes from the model, not from a stdlib config.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl.api import check_file, layout_diagnostics, simulate_file
from trainverify_dsl.check.verdict import ERROR, VERIFIED
from trainverify_dsl.plan import lint_file

MODEL = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.lin = nn.Linear(h, h, bias=True)

    def forward(self, x):
        return x + torch.relu(self.lin(x))


class PipeNet(nn.Module):
    def __init__(self, d: int = 4, hid: int = 8, n_blocks: int = 4):
        super().__init__()
        self.d = d
        self.proj = nn.Linear(d, hid, bias=False)
        self.{name} = nn.ModuleList([Block(hid) for _ in range(n_blocks)])
        self.head = nn.Linear(hid, d, bias=False)

    def input_specs(self, batch, seq):
        dt = torch.get_default_dtype()
        return {{"inp": ((batch, self.d), dt), "lbl": ((batch, self.d), dt)}}

    def forward(self, inp, lbl):
        h = self.proj(inp)
        for b in self.{name}:
            h = b(h)
        err = self.head(h) - lbl
        return (err * err).mean()
'''

HEAD = '''plan p
spec "net.py:PipeNet" batch 8 seq 1
spec-optimizer sgd lr=0.1 momentum=0.9
mesh pp=2, rows=2
microbatches 2 schedule {schedule}
loss-scale 1/microbatches
split inp [rows, -]
split lbl [rows, -]
{stages}
all-reduce grad(params) over rows op=avg
optimizer sgd lr=0.1 momentum=0.9
'''

INTERLEAVED = ("pipeline-stage 0: proj, {L}[0:1], {L}[2:3]\n"
               "pipeline-stage 1: {L}[1:2], {L}[3:4], head, loss")
OVERLAP = "pipeline-stage 0: proj, {L}[0:3]\npipeline-stage 1: {L}[2:4], head, loss"
PART = "pipeline-stage 0: proj, {L}[0:2], {L}.2.lin\npipeline-stage 1: {L}[2:4], head, loss"
GAP = "pipeline-stage 0: proj, {L}[0:1]\npipeline-stage 1: {L}[2:4], head, loss"
NAMES = ["blocks", "layers", "trunk"]


def write(tmp_path: Path, name: str, stages: str, schedule: str = "1f1b") -> Path:
    (tmp_path / "net.py").write_text(MODEL.format(name=name), encoding="utf-8")
    path = tmp_path / "p.tvp"
    path.write_text(HEAD.format(schedule=schedule, stages=stages.format(L=name)),
                    encoding="utf-8")
    return path


def errors(diagnostics: list) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line) for d in diagnostics if d.severity.name == "ERROR"]


@pytest.mark.parametrize("name", NAMES)
def test_interleaved_virtual_stages_of_any_list_are_verified(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, name, INTERLEAVED, "interleaved-1f1b")
    assert errors(lint_file(path)) == []
    assert errors(layout_diagnostics(path)) == []
    if name != "blocks":
        return  # one run of simulate and check is enough: the other names lint the same
    assert simulate_file(path).agrees
    verdict = check_file(path, cache=False)
    assert verdict.verdict == VERIFIED, verdict


@pytest.mark.parametrize("name", NAMES)
def test_interleaved_over_one_chunk_per_rank_is_refused_for_any_list(tmp_path: Path,
                                                                    name: str) -> None:
    path = write(tmp_path, name, "pipeline-stage 0: proj, {L}[0:2]\n"
                 "pipeline-stage 1: {L}[2:4], head, loss", "interleaved-1f1b")
    assert errors(lint_file(path)) == [("TVP247", 5)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("stages", "line", "message"), [
    (OVERLAP, 10, "layer 2 is in pipeline stage 0 ('{L}[0:3]') and stage 1 ('{L}[2:4]')"),
    (PART, 9, "'{L}.2.lin' is in pipeline stage 0, but stage 1 holds all of '{L}[2:4]'"),
])
def test_overlapping_stages_are_tvp242_for_any_list(tmp_path: Path, name: str, stages: str,
                                                    line: int, message: str) -> None:
    path = write(tmp_path, name, stages)
    (diagnostic,) = lint_file(path)
    assert (diagnostic.code.id, diagnostic.span.line, diagnostic.span.col) == ("TVP242", line, 1)
    assert diagnostic.message == message.format(L=name)


@pytest.mark.parametrize("name", NAMES)
def test_a_block_on_no_stage_is_tvp245_at_the_models_length(tmp_path: Path, name: str) -> None:
    """The plan alone does not know the list's length (a user model, no layer count): the
    layout pass does, and reports the block left out, at the last stage's line."""
    path = write(tmp_path, name, GAP)
    assert errors(lint_file(path)) == []
    (diagnostic,) = [d for d in layout_diagnostics(path) if d.severity.name == "ERROR"]
    assert (diagnostic.code.id, diagnostic.span.line, diagnostic.span.col) == ("TVP245", 10, 1)
    assert diagnostic.message == "pipeline stages leave 1 of 4 layers unassigned"
    assert f"unassigned layers: {name}[1]" in diagnostic.notes
    verdict = check_file(path, cache=False)
    assert verdict.verdict == ERROR
    assert [d.code.id for d in verdict.diagnostics if d.severity.name == "ERROR"] == ["TVP245"]


def test_the_covering_plan_is_clean(tmp_path: Path) -> None:
    path = write(tmp_path, "blocks", "pipeline-stage 0: proj, blocks[0:2]\n"
                 "pipeline-stage 1: blocks[2:4], head, loss")
    assert errors(lint_file(path)) == []
    assert errors(layout_diagnostics(path)) == []


def test_a_list_the_plan_does_not_index_is_an_ordinary_module(tmp_path: Path) -> None:
    """`blocks` named whole on one stage is that stage's module; nothing is left out."""
    path = write(tmp_path, "blocks", "pipeline-stage 0: proj\n"
                 "pipeline-stage 1: blocks, head, loss")
    assert errors(lint_file(path)) == []
    assert errors(layout_diagnostics(path)) == []
