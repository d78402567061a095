"""torch's own building blocks in a user's model, as they come.

`nn.MultiheadAttention` and `nn.TransformerEncoderLayer` (PyTorch's stock transformer) were
rejected on a plain data-parallel plan, three ways:

- their attention runs SDPA's math path, whose safe softmax tests each row of scores with
  `aten.any` over the keys: no layout rule (TVP403);
- `nn.Linear` applied to a transposed (not contiguous) 3-d input is an `expand` of the
  weight to the batch and a `bmm`: the batched product refused a batch dimension split on
  one operand and broadcast on the other (TVP403);
- the attention's rows are merged sequence-major (`[s*b, d]`) and viewed back as
  `[s, b, d]`, which the size analysis took for a fixed number of groups of the batch's rows
  (TVP313).

Convolutions (`nn.Conv1d`, `nn.Conv2d`) had no IR op at all (TVP403 at the plan's first
statement). They are now decomposed, for both programs, into windows and a batched matrix
product (`spec/decompose.py`); the decomposition is compared with torch's convolution here,
values and gradients.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainverify_dsl.api import check_file, layout_diagnostics
from trainverify_dsl.spec.decompose import convolution, vector_norm

MODEL = textwrap.dedent('''\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, d=8, heads=2):
            super().__init__()
            self.d = d
            self.mha = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoderLayer(d, heads, dim_feedforward=16, dropout=0.0,
                                                  batch_first=True)
            self.out = nn.Linear(d, 1)

        def input_specs(self, batch, seq):
            return {"x": ((batch, seq, self.d), torch.float32),
                    "y": ((batch, seq, 1), torch.float32)}

        def forward(self, x, y):
            a, _ = self.mha(x, x, x, need_weights=False)
            return ((self.out(self.enc(x + a)) - y) ** 2).mean()
''')

PLAN = textwrap.dedent('''\
    plan stock
    spec "net.py:Net" batch 4 seq 4
    spec-optimizer sgd lr=0.1
    mesh dp=2
    split x [dp, -, -]
    split y [dp, -, -]
    all-reduce grad(params) over dp op=avg
    optimizer sgd lr=0.1
''')


def write(tmp_path: Path, plan: str = PLAN) -> Path:
    (tmp_path / "net.py").write_text(MODEL, encoding="utf-8")
    path = tmp_path / "stock.tvp"
    path.write_text(plan, encoding="utf-8")
    return path


def test_torchs_transformer_layers_under_data_parallelism_are_verified(tmp_path: Path
                                                                        ) -> None:
    path = write(tmp_path)
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"


def test_summed_gradients_over_torchs_transformer_layers_are_a_counterexample(
        tmp_path: Path) -> None:
    path = write(tmp_path, PLAN.replace("op=avg", "op=sum"))
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "counterexample"
    assert any(d.span.line == 7 for d in verdict.diagnostics), verdict.diagnostics


def test_the_distributed_oracle_agrees_on_torchs_transformer_layers(tmp_path: Path) -> None:
    from trainverify_dsl.oracle import run_distributed

    result = run_distributed(str(write(tmp_path)), allow_model_outside_root=True)
    assert result.error is None, result.error
    assert result.compared > 0 and result.max_rel_error < 1e-10


@pytest.mark.parametrize("shape,weight,stride,padding,dilation,groups", [
    ((2, 3, 7), (4, 3, 3), (1,), (1,), (1,), 1),
    ((2, 4, 9), (6, 2, 3), (2,), (2,), (2,), 2),
    ((1, 4, 5), (4, 1, 1), (1,), (0,), (1,), 4),
    ((2, 2, 5, 6), (3, 2, 2, 3), (1, 2), (1, 0), (1, 1), 1),
    ((2, 4, 6, 5), (4, 2, 3, 3), (2, 1), (1, 1), (1, 2), 2),
    ((1, 2, 3, 4, 4), (2, 2, 2, 1, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1), 1),
])
def test_the_convolution_decomposition_is_torchs_convolution(
        shape: tuple, weight: tuple, stride: tuple, padding: tuple, dilation: tuple,
        groups: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(weight, dtype=torch.float64, requires_grad=True)
    b = torch.randn(weight[0], dtype=torch.float64, requires_grad=True)
    ours = convolution(x, w, b, stride, padding, dilation, False, (0,) * len(stride), groups)
    theirs = torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False,
                                        (0,) * len(stride), groups)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(ours.shape, dtype=torch.float64)
    mine = torch.autograd.grad(ours, (x, w, b), cotangent)
    torch_s = torch.autograd.grad(theirs, (x, w, b), cotangent)
    for a, c in zip(mine, torch_s, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


def test_a_transposed_convolution_is_left_to_aten() -> None:
    x, w = torch.randn(1, 2, 4), torch.randn(2, 3, 3)
    assert convolution(x, w, None, (1,), (0,), (1,), True, (0,), 1) is NotImplemented
    assert F.conv_transpose1d(x, w).shape == (1, 3, 6)


CONV_MODEL = textwrap.dedent('''\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, c=3):
            super().__init__()
            self.c = c
            self.c1 = nn.Conv1d(c, 8, 3, padding=1)
            self.c2 = nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=2, stride=2)
            self.c3 = nn.Conv2d(1, 2, (2, 3), padding=(1, 0))
            self.fc = nn.Linear(9, 4)

        def input_specs(self, batch, seq):
            return {"x": ((batch, self.c, seq), torch.float32),
                    "y": ((batch, 4), torch.float32)}

        def forward(self, x, y):
            h = torch.relu(self.c1(x))
            h = torch.tanh(self.c2(h))
            h = self.c3(h.unsqueeze(1)).mean((1, 3))
            return ((self.fc(h) - y) ** 2).mean()
''')


def test_convolutions_under_data_parallelism_are_verified_and_a_wrong_sync_is_found(
        tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(CONV_MODEL, encoding="utf-8")
    path = tmp_path / "conv.tvp"
    path.write_text(PLAN.replace("batch 4 seq 4", "batch 4 seq 6")
                    .replace("split y [dp, -, -]", "split y [dp, -]"), encoding="utf-8")
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"
    path.write_text(path.read_text(encoding="utf-8").replace("op=avg", "op=sum"),
                    encoding="utf-8")
    assert check_file(path, allow_model_outside_root=True).verdict == "counterexample"


STACK_MODEL = textwrap.dedent('''\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def input_specs(self, batch, seq):
            return {"x": ((batch, seq, 4), torch.float32), "y": ((batch, seq, 4), torch.float32)}


    class Stacked(Net):  # two views of every row, stacked in front and summed
        def forward(self, x, y):
            h = self.fc(x)
            return ((torch.stack([h, 2 * h]).sum(0) - y) ** 2).mean()


    class Flipped(Net):  # positions reversed (a bidirectional mix); rows reversed
        def forward(self, x, y):
            h = self.fc(x)
            h = h + torch.flip(h, dims=[1])
            return ((h - y) ** 2).mean() + (torch.flip(h, dims=[DIM]) * y).mean()


    class Looked(Net):  # rows of a table looked up by each rank's own (top-k) indices
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(4, 3) * 0.5)

        def forward(self, x, y):
            h = self.fc(x)
            b, s, d = h.shape
            _, idx = torch.topk(h, 2, dim=-1)
            rows = torch.index_select(self.table, 0, idx.reshape(-1)).view(b, s, 6)
            return ((rows.sum(-1, keepdim=True) * h - y) ** 2).mean()


    class Regrouped(Net):  # the joined rows read as pairs: a rank's pairs are not the spec's
        def forward(self, x, y):
            h = self.fc(x)
            b, s, d = h.shape
            g = torch.cat([h, 2 * h], 0).view(b, 2, s, d)
            return ((g[:, 0] * g[:, 1] - y) ** 2).mean()
''')


def stack_plan(tmp_path: Path, cls: str, extra: str = "") -> Path:
    """`STACK_MODEL` (with the class ``extra`` added) as `net.py`, and the data-parallel plan
    of its class ``cls``."""
    (tmp_path / "net.py").write_text(STACK_MODEL.replace(
        "class Regrouped(Net):", f"{extra}\n\nclass Regrouped(Net):"), encoding="utf-8")
    path = tmp_path / f"{cls.lower()}.tvp"
    path.write_text(PLAN.replace("net.py:Net", f"net.py:{cls}")
                    .replace("batch 4 seq 4", "batch 4 seq 2"), encoding="utf-8")
    return path


def test_a_stack_of_split_rows_is_verified_and_rows_regrouped_across_ranks_are_refused(
        tmp_path: Path) -> None:
    """`torch.stack([h, 2 * h])` of the split batch is `cat` along the split dimension, then
    a view: refused (TVP403, "cat along dimension 0, which is split over dp") although each
    rank stacks its own rows. Pieces split alike join as an outer factor now; reading the
    joined rows in another grouping is still a layout error."""
    stacked = stack_plan(tmp_path, "Stacked")
    assert layout_diagnostics(stacked, allow_model_outside_root=True) == []
    assert check_file(stacked, allow_model_outside_root=True).verdict == "verified"
    regrouped = stack_plan(tmp_path, "Regrouped")
    assert [d.code.id for d in layout_diagnostics(regrouped, allow_model_outside_root=True)
            ] == ["TVP403"]


def test_a_flip_along_a_whole_dimension_is_verified_and_along_the_split_one_refused(
        tmp_path: Path) -> None:
    """`torch.flip` had no layout rule (TVP403 on every split plan)."""
    base = tmp_path
    for dim, verdict in ((1, "verified"), (0, "error")):
        tmp_path = base / str(dim)
        tmp_path.mkdir()
        (tmp_path / "net.py").write_text(STACK_MODEL.replace("DIM", str(dim)), encoding="utf-8")
        path = tmp_path / "flipped.tvp"
        path.write_text(PLAN.replace("net.py:Net", "net.py:Flipped")
                        .replace("batch 4 seq 4", "batch 4 seq 2"), encoding="utf-8")
        assert check_file(path, allow_model_outside_root=True).verdict == verdict
        if dim == 0:
            [error] = layout_diagnostics(path, allow_model_outside_root=True)
            assert error.code.id == "TVP403" and "flip along dimension 0" in error.message


def test_a_model_file_edited_between_two_checks_of_one_process_is_read_again(
        tmp_path: Path) -> None:
    """A user model was imported once per process and path: a notebook or search loop that
    edited the model and called `api.check` again checked the model it met first (the flip
    moved onto the split rows above was VERIFIED in the process that had checked the right
    one)."""
    path = tmp_path / "flipped.tvp"
    path.write_text(PLAN.replace("net.py:Net", "net.py:Flipped")
                    .replace("batch 4 seq 4", "batch 4 seq 2"), encoding="utf-8")
    model = tmp_path / "net.py"
    model.write_text(STACK_MODEL.replace("DIM", "1"), encoding="utf-8")
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"
    model.write_text(STACK_MODEL.replace("DIM", "0"), encoding="utf-8")
    assert check_file(path, allow_model_outside_root=True).verdict == "error"


def test_a_helper_module_edited_between_two_checks_of_one_process_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model file was read again after an edit, but the modules it imports were not:
    with the helper edited to mix the batch's rows, the second check still ran the first
    helper and said VERIFIED."""
    helper = f"tvp_test_helper_{tmp_path.name.replace('-', '_')}"
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "net.py").write_text(STACK_MODEL.replace("class Stacked", textwrap.dedent(f"""\
        from {helper} import combine


        class Combined(Net):
            def forward(self, x, y):
                return ((combine(self.fc(x)) - y) ** 2).mean()


        class Stacked""")), encoding="utf-8")
    path = tmp_path / "combined.tvp"
    path.write_text(PLAN.replace("net.py:Net", "net.py:Combined")
                    .replace("batch 4 seq 4", "batch 4 seq 2"), encoding="utf-8")
    module = tmp_path / f"{helper}.py"
    module.write_text("def combine(h):\n    return 2 * h\n", encoding="utf-8")
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"
    module.write_text("def combine(h):\n    return h * h.mean(0)\n", encoding="utf-8")
    assert check_file(path, allow_model_outside_root=True).verdict != "verified"


def test_an_index_select_by_each_ranks_own_indices_is_verified(tmp_path: Path) -> None:
    """`torch.index_select(table, 0, idx)` with `idx` split over dp (a lookup, as
    `F.embedding`) was refused: "every rank needs the whole index"."""
    path = stack_plan(tmp_path, "Looked")
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"


SDPA_MODEL = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Attn(nn.Module):
        def __init__(self, d=4):
            super().__init__()
            self.d = d
            self.wq = nn.Linear(d, d, bias=False)
            self.wo = nn.Linear(d, d, bias=False)

        def input_specs(self, batch, seq):
            return {"x": ((batch, seq, self.d), torch.float32),
                    "y": ((batch, seq, self.d), torch.float32)}

        def forward(self, x, y):
            b, s, d = x.shape
            q = self.wq(x).view(b, s, 2, -1).transpose(1, 2)
            h = x.view(b, s, 2, -1).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, h, h).transpose(1, 2).reshape(b, s, d)
            return F.mse_loss(self.wo(o), y, reduction="sum")
''')


def test_a_weight_expanded_along_the_batch_gets_a_partial_gradient(tmp_path: Path) -> None:
    """`self.wo(o)` on the transposed heads of `F.scaled_dot_product_attention` is an
    `expand` of the weight to the batch and a `bmm`: the layout pass took the expanded
    weight to run along the split batch, so its gradient was complete over dp — TVP406 on
    the right `op=sum` plan, and no TVP410 when the reduction is missing (only the numbers
    found that)."""
    (tmp_path / "attn.py").write_text(SDPA_MODEL, encoding="utf-8")
    text = ('plan p\nspec "attn.py:Attn" batch 4 seq 3\nspec-optimizer sgd lr=0.1\n'
            "mesh dp=2\nloss-reduction sum scale=1\nsplit x [dp, -, -]\nsplit y [dp, -, -]\n"
            "all-reduce grad(params) over dp op=sum\noptimizer sgd lr=0.1\n")
    right = tmp_path / "right.tvp"
    right.write_text(text, encoding="utf-8")
    assert layout_diagnostics(right, allow_model_outside_root=True) == []
    missing = tmp_path / "missing.tvp"
    missing.write_text(text.replace("all-reduce grad(params) over dp op=sum\n", ""),
                       encoding="utf-8")
    found = layout_diagnostics(missing, allow_model_outside_root=True)
    assert any(d.code.id == "TVP410" and "`wo.weight`" in " ".join((d.message,) + d.notes)
               for d in found), found


def test_an_op_without_a_layout_rule_names_the_models_line(tmp_path: Path) -> None:
    """TVP403 pointed at the plan's `split` line and "in the spec model at `(root)`": the
    model line computing the op is a note now."""
    path = stack_plan(tmp_path, "Cumulative", (
        "class Cumulative(Net):\n"
        "    def forward(self, x, y):\n"
        "        return ((torch.cumprod(self.fc(x), 0) - y) ** 2).mean()  # LINE\n"))
    [error] = layout_diagnostics(path, allow_model_outside_root=True)
    line = next(i for i, t in enumerate((tmp_path / "net.py").read_text().splitlines(), 1)
                if "# LINE" in t)
    assert error.code.id == "TVP403"
    assert f"computed by the model's code at {tmp_path / 'net.py'}:{line}" in error.notes


@pytest.mark.parametrize("ord,dim,keepdim", [(2, -1, True), (2, None, False), (1, (0, 2), False),
                                             (float("inf"), 1, True), (3, -1, False)])
def test_the_vector_norm_decomposition_is_torchs_norm(ord: float, dim: object, keepdim: bool
                                                      ) -> None:
    """`torch.norm` / `F.normalize` (`aten.linalg_vector_norm`) had no IR op (TVP403 or
    TVP304: QK-norm, cosine similarity, weight norm); it is its arithmetic now."""
    torch.manual_seed(1)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    ours = vector_norm(x, ord, dim, keepdim)
    theirs = torch.linalg.vector_norm(x, ord, dim, keepdim)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(ours.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(ours, x, cotangent)[0],
                               torch.autograd.grad(theirs, x, cotangent)[0],
                               rtol=1e-10, atol=1e-12)
    assert vector_norm(x, 0) is NotImplemented


def test_a_normalised_projection_under_data_parallelism_is_verified(tmp_path: Path) -> None:
    path = stack_plan(tmp_path, "Normalised", (
        "class Normalised(Net):\n"
        "    def forward(self, x, y):\n"
        "        h = torch.nn.functional.normalize(self.fc(x), dim=-1)\n"
        "        return ((h * torch.norm(self.fc.weight) - y) ** 2).mean()\n"))
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"


def test_group_normalisation_under_data_parallelism_is_verified(tmp_path: Path) -> None:
    """`nn.GroupNorm` had no layout rule (`native_group_norm`); it is its arithmetic now
    (torch's decomposition, in the one table), its statistics per row: a split batch is
    fine. (With `affine=True` on a transposed input torch's decomposition meets an
    `as_strided`, which has no layout rule: TVP403.)"""
    path = stack_plan(tmp_path, "Grouped", (
        "class Grouped(Net):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.norm = nn.GroupNorm(2, 4, affine=False)\n\n"
        "    def forward(self, x, y):\n"
        "        h = self.norm(self.fc(x).transpose(1, 2)).transpose(1, 2)\n"
        "        return ((h - y) ** 2).mean()\n"))
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    assert check_file(path, allow_model_outside_root=True).verdict == "verified"


def test_a_nan_constant_of_the_step_is_inconclusive_not_an_internal_error(tmp_path: Path
                                                                           ) -> None:
    """`F.kl_div` (without `log_target`) decomposes through `xlogy`, which builds a NaN
    constant for the branch `isnan` never takes: on a plan splitting nothing the proof read
    it and `tvp check` ended in an internal error ("NonReal: a NaN constant")."""
    path = stack_plan(tmp_path, "Divergent", (
        "class Divergent(Net):\n"
        "    def forward(self, x, y):\n"
        "        p = torch.log_softmax(self.fc(x), -1)\n"
        "        return torch.nn.functional.kl_div(p, torch.softmax(y, -1), "
        "reduction='mean')\n"))
    path.write_text("\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                              if not line.startswith(("split", "all-reduce"))) + "\n",
                    encoding="utf-8")
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "inconclusive" and "NaN" in verdict.reason, verdict.reason
