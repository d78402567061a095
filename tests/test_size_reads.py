"""Sizes read as numbers (``spec/sizes.py``, TVP311): a model dividing by ``x.shape[0]``
is traced with the global batch as a constant, while each rank of a real run reads its own.
A plan summing such per-rank losses was VERIFIED although its run scales every gradient by
the number of data blocks. Now the layout pass (every plan command runs it first) reports
the read at the model line whenever the plan splits a dimension the number follows; reads
the plan does not split, shape arguments and the shipped models are not reported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainverify_dsl.api import check_file, layout_diagnostics
from trainverify_dsl.spec.load import ModelAccess, load_model, model_input_specs, resolve_ref
from trainverify_dsl.spec.sizes import size_reads

MODELS = textwrap.dedent('''\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def input_specs(self, batch, seq):
            return {"x": ((batch, seq, 4), torch.float32), "y": ((batch, seq, 4), torch.float32)}


    class PerBatch(Net):
        def forward(self, x, y):
            return ((self.fc(x) - y) ** 2).sum() / x.shape[0]  # LINE batch


    class PerPosition(Net):
        def forward(self, x, y):
            return ((self.fc(x) - y) ** 2).mean(0).sum() / x.size(1)  # LINE seq


    class Mean(Net):
        def forward(self, x, y):
            h = self.fc(x).reshape(x.shape[0], -1)  # a shape argument, not arithmetic
            return ((h - y.reshape(y.shape[0], -1)) ** 2).sum(-1).mean()


    def _norm(g):
        mu = g.mean(1, keepdim=True)
        return (g - mu) / torch.sqrt(((g - mu) ** 2).mean(1, keepdim=True) + 1e-5)


    class TwoGroups(Net):
        def forward(self, x, y):  # ghost batch norm: 2 virtual batches of rows
            h = _norm(self.fc(x).view(2, -1, 4)).view(x.shape)  # LINE groups
            return ((h - y) ** 2).mean()


    class GroupsOfTwo(Net):
        def forward(self, x, y):  # virtual batches of 2 rows: the same on any rank
            h = _norm(self.fc(x).view(-1, 2, 2, 4).flatten(1, 2)).view(x.shape)
            return ((h - y) ** 2).mean()


    class SequenceMajor(Net):
        def forward(self, x, y):  # nn.MultiheadAttention's rows: sequence outer, batch inner
            b, s, d = x.shape
            h = self.fc(x.transpose(0, 1).reshape(s * b, d)).view(s, b, d).transpose(0, 1)
            return ((h - y) ** 2).mean()


    class BatchMajorRegrouped(Net):
        def forward(self, x, y):  # batch-major rows cut into `s` groups: a rank's differ
            b, s, d = x.shape
            h = self.fc(x.reshape(b * s, d)).view(s, b, d)  # LINE regrouped
            h = h - h.mean(1, keepdim=True)
            return ((h.reshape(b, s, d) - y) ** 2).mean()


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, h):
            return self.fc(h) / h.shape[0]  # LINE block


    class Stack(Net):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x, y):
            for layer in self.layers:
                x = layer(x)
            return ((self.fc(x) - y) ** 2).mean()
''')


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(MODELS.splitlines(), 1) if f"# LINE {marker}" in text)


def plan(tmp_path: Path, cls: str, body: str, sizes: str = "batch 8 seq 2") -> Path:
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    path = tmp_path / f"{cls.lower()}.tvp"
    path.write_text(f'plan p\nspec "models.py:{cls}" {sizes}\nspec-optimizer sgd lr=0.1\n'
                    f"{body}optimizer sgd lr=0.1\n", encoding="utf-8")
    return path


DP_SUM = ("mesh dp=2\nloss-reduction sum scale=1\nsplit x [dp, -, -]\nsplit y [dp, -, -]\n"
          "all-reduce grad(params) over dp op=sum\n")
DP_AVG = ("mesh dp=2\nsplit x [dp, -, -]\nsplit y [dp, -, -]\n"
          "all-reduce grad(params) over dp op=avg\n")


def size_errors(path: Path) -> list:
    return [d for d in layout_diagnostics(path, allow_model_outside_root=True)
            if d.code.id == "TVP311"]


def test_a_loss_divided_by_the_batch_read_in_python_is_an_error_at_the_model_line(
        tmp_path: Path) -> None:
    """Summed over dp=2 with op=sum the plan matched the traced step (both divide by 8) and
    was verified; a real run divides each rank's sum by 4 and doubles every gradient."""
    path = plan(tmp_path, "PerBatch", DP_SUM)
    [error] = size_errors(path)
    assert error.span.file.endswith("models.py") and error.span.line == line_of("batch")
    assert "8" in error.message and "16" in error.message  # global and doubled batch
    assert any("dimension 0 of `x` over dp" in n for n in error.notes)
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict != "verified"
    assert any(d.code.id == "TVP311" for d in verdict.diagnostics)


def test_microbatches_split_the_batch_too(tmp_path: Path) -> None:
    path = plan(tmp_path, "PerBatch", "mesh dp=2\nmicrobatches 2\nloss-scale 1/microbatches\n"
                "all-reduce grad(params) over dp op=avg\n")
    [error] = size_errors(path)
    assert any("microbatches" in n for n in error.notes)


def test_a_size_the_plan_does_not_split_is_every_ranks_own(tmp_path: Path) -> None:
    """Every rank reads the whole batch (no split, one microbatch): its x.shape[0] is the
    global one, and nothing is reported."""
    path = plan(tmp_path, "PerBatch", "mesh dp=2\nall-reduce grad(params) over dp op=avg\n")
    assert size_errors(path) == []


def test_a_position_count_read_under_a_sequence_split(tmp_path: Path) -> None:
    path = plan(tmp_path, "PerPosition", "mesh cp=2\nsplit x [-, cp, -]\nsplit y [-, cp, -]\n"
                "all-reduce grad(params) over cp op=sum\n")
    [error] = size_errors(path)
    assert error.span.line == line_of("seq")
    assert any("dimension 1 of `x` over cp" in n for n in error.notes)
    # the batch is not split: the same read is every rank's own there
    assert size_errors(plan(tmp_path, "PerPosition", DP_AVG)) == []


def test_a_read_inside_a_block_is_found(tmp_path: Path) -> None:
    [error] = size_errors(plan(tmp_path, "Stack", DP_AVG))
    assert error.span.line == line_of("block")


def test_sizes_as_shape_arguments_and_means_are_not_reads(tmp_path: Path) -> None:
    path = plan(tmp_path, "Mean", DP_AVG)
    assert size_errors(path) == []
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"


def test_a_view_fixing_the_number_of_row_groups_is_an_error_at_the_model_line(
        tmp_path: Path) -> None:
    """Ghost batch norm with 2 virtual batches (`h.view(2, -1, d)`) over dp=2: the lowering
    gives the view its local sizes, so each rank normalised the spec's group of 4 rows and
    the plan was VERIFIED (simulate and run-distributed agreed); a real rank cuts its 4 rows
    into 2 groups of 2 (found by an outside user's DistributedDataParallel run). Groups of a
    fixed size are the same on every rank and are not reported."""
    path = plan(tmp_path, "TwoGroups", DP_AVG)
    [error] = [d for d in layout_diagnostics(path, allow_model_outside_root=True)
               if d.code.id == "TVP313"]
    assert error.span.file.endswith("models.py") and error.span.line == line_of("groups")
    assert "into 2 groups" in error.message
    assert any("dimension 0 of `x` over dp" in n for n in error.notes)
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict != "verified"
    microbatched = plan(tmp_path, "TwoGroups", "mesh dp=1\nmicrobatches 2\n"
                        "loss-scale 1/microbatches\n")
    assert [d.code.id for d in layout_diagnostics(microbatched, allow_model_outside_root=True)
            if d.code.id == "TVP313"] == ["TVP313"]
    unsplit = plan(tmp_path, "TwoGroups", "mesh dp=2\nall-reduce grad(params) over dp op=avg\n")
    assert not any(d.code.id == "TVP313" for d in
                   layout_diagnostics(unsplit, allow_model_outside_root=True))
    fixed_size = plan(tmp_path, "GroupsOfTwo", DP_AVG)
    assert layout_diagnostics(fixed_size, allow_model_outside_root=True) == []
    assert check_file(fixed_size, allow_model_outside_root=True).verdict == "verified"


def test_a_view_splitting_off_a_merged_fixed_factor_is_not_a_count_of_row_groups(
        tmp_path: Path) -> None:
    """torch's `nn.MultiheadAttention` (and `TransformerEncoderLayer`) merges its rows
    sequence-major (`[s*b, d]`) and views them back as `[s, b, d]`: the `s` outer groups do
    not grow with the batch, but they are the sequence, not groups of the batch's rows, and
    a rank's view of its own rows is its piece of the spec's. It was TVP313 on every data
    parallel plan. The same view of batch-major rows (`[b*s, d]` as `[s, b, d]`) regroups
    rows across sequences and stays an error."""
    sequence_major = plan(tmp_path, "SequenceMajor", DP_AVG)
    assert layout_diagnostics(sequence_major, allow_model_outside_root=True) == []
    assert check_file(sequence_major, allow_model_outside_root=True).verdict == "verified"
    regrouped = plan(tmp_path, "BatchMajorRegrouped", DP_AVG)
    [error] = [d for d in layout_diagnostics(regrouped, allow_model_outside_root=True)
               if d.code.id == "TVP313"]
    assert error.span.line == line_of("regrouped") and "into 2 groups" in error.message


@pytest.mark.parametrize("model,config", [
    ("stdlib/models/llama.py:Llama", "llama_tiny"),
    ("stdlib/models/gpt2.py:GPT2", "gpt2_tiny"),
    ("stdlib/models/deepseek.py:DeepSeekV3", "deepseek_tiny"),
    ("stdlib/models/mlp.py:MLP", "mlp_tiny"),
    ("stdlib/models/llama.py:Llama", "llama3_405b"),
])
def test_the_shipped_models_read_no_size(model: str, config: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainverify_dsl.spec import sizes

    root = Path(__file__).resolve().parent.parent
    fake = load_model(resolve_ref(model, config, ModelAccess(base=root)), fake=True)
    assert size_reads(fake, lambda b, s: model_input_specs(fake, b, s), 8, 4) == []

    class Every:  # every op's numbers compared: the shapes' own differ, so the graphs were
        def __contains__(self, op: object) -> bool:  # exported and compared (not vacuous)
            return True

    if model.endswith(":MLP"):  # no shape argument at all: nothing to show
        return
    monkeypatch.setattr(sizes, "ARITHMETIC", Every())
    assert size_reads(fake, lambda b, s: model_input_specs(fake, b, s), 8, 4) != []


def test_only_sizes_that_change_a_split_dimension_are_traced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each size compared exports the model once more: a plan that splits no data dimension
    (tensor parallel alone) traces none, one that splits the batch only traces the batch's,
    and what is reported for the batch is what a full run reports for it."""
    from trainverify_dsl.spec import sizes

    root = Path(__file__).resolve().parent.parent
    fake = load_model(resolve_ref("stdlib/models/llama.py:Llama", "llama_tiny",
                                  ModelAccess(base=root)), fake=True)
    exported: list[object] = []
    graphs = sizes._graphs
    monkeypatch.setattr(sizes, "_graphs",
                        lambda *args: exported.append(args) or graphs(*args))
    monkeypatch.setattr(sizes, "ARITHMETIC", type("Every", (), {
        "__contains__": lambda self, op: True})())
    specs = lambda b, s: model_input_specs(fake, b, s)  # noqa: E731
    assert size_reads(fake, specs, 8, 4, wanted=lambda changed: False) == []
    assert not exported
    everything = size_reads(fake, specs, 8, 4)
    assert len(exported) == 3
    exported.clear()
    batch = size_reads(fake, specs, 8, 4, wanted=lambda changed: ("tokens", 0) in changed)
    assert len(exported) == 2
    assert batch and batch == [r for r in everything if ("tokens", 0) in r[1]]
