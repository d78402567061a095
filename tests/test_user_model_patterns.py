"""Patterns of models written outside the project that the pipeline must take as they are.

- Hugging Face's RMSNorm computes in float32 and casts back (``x.to(torch.float32)`` ...
  ``.to(dtype)``): export checks the cast with ``aten._assert_tensor_metadata``, which had no
  layout rule (TVP403 on a plain data-parallel plan), and eager torch's float32 round-off
  made the reference check call the trusted base wrong. Casts are the identity of the IR's
  reals; the eager reference runs every float dtype the model names as float64.
- A mask the forward builds with an in-place write is a lifted constant of the capture; its
  local node had no fake value (an internal ``KeyError: 'val'``), and AOTAutograd lifted it
  into an input of the stage's joint the importer did not know. The spec's tracer then
  refuses the value read (TVP305) in the model's forward.
  The distributed oracle's single-device step and its ranks run it in float64 too (they
  rounded apart, 1e-7, and the oracle said "differs").
- Batch normalisation with batch statistics (``BatchNorm1d(track_running_stats=False)``):
  the IR had no op for it (TVP304 from every command). Both programs now run it as its
  arithmetic (``var_mean`` over every dimension but the channels): its channels may be
  split over tp; its batch may not be split (each rank's statistics would be its own).
- A sequence split gathered before a pooling: every sp rank holds the same loss, and the
  gradient shares of its pieces add up (op=sum over sp). The scale rule of §4.7 counted sp
  among the data ranks (it splits an input) and called the right plan 2 times off (TVP411).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional

import pytest

from trainverify_dsl.api import check_file, layout_diagnostics

MODELS = textwrap.dedent('''\
    import torch
    from torch import nn


    class HFRMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            dtype = x.dtype
            x = x.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x.to(dtype)


    class NormNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 8, bias=False)
            self.norm = HFRMSNorm(8)
            self.out = nn.Linear(8, 4, bias=False)

        def input_specs(self, batch, seq):
            return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

        def forward(self, inp, tgt):
            h = self.norm(self.fc(inp)) + torch.ones(8, dtype=torch.float32)
            return ((self.out(h) - tgt) ** 2).mean()


    class RampNet(NormNet):
        def forward(self, inp, tgt):  # a factory given no dtype: float32 by default
            h = self.fc(inp) * torch.linspace(0.5, 1.5, 8)
            return ((self.out(h) - tgt) ** 2).mean()


    class MaxPool(nn.Module):
        def forward(self, h):
            return h.amax(dim=1)


    class PoolNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 8, bias=False)
            self.pool = MaxPool()
            self.head = nn.Linear(8, 4, bias=False)

        def input_specs(self, batch, seq):
            return {"inp": ((batch, seq, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

        def forward(self, inp, tgt):
            e = self.head(self.pool(self.proj(inp))) - tgt
            return (e * e).mean()


    class BatchNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.bn = nn.BatchNorm1d(8, track_running_stats=False)
            self.fc2 = nn.Linear(8, 4, bias=False)

        def input_specs(self, batch, seq):
            return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

        def forward(self, inp, tgt):
            e = self.fc2(torch.relu(self.bn(self.fc1(inp)))) - tgt
            return (e * e).mean()


    class BetweenNet(nn.Module):
        """Ops of the parent between its blocks (a residual and an activation per layer)."""

        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
            self.temp = nn.Parameter(torch.ones(4))

        def input_specs(self, batch, seq):
            return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

        def forward(self, inp, tgt):
            h = self.proj(inp)
            for b in self.blocks:
                h = h + torch.relu(b(h))
            return ((h * self.temp - tgt) ** 2).mean()


    class ScaledBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, h, scale):
            return h + torch.tanh(self.fc(h)) * scale


    class PerLayerNet(BetweenNet):
        """Each block gets an argument of its own (a per-layer scale)."""

        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([ScaledBlock() for _ in range(2)])
            self.register_buffer("scales", torch.tensor([0.5, 2.0]))

        def forward(self, inp, tgt):
            h = self.proj(inp)
            for k, b in enumerate(self.blocks):
                h = b(h, self.scales[k])
            return ((h * self.temp - tgt) ** 2).mean()


    class MeanSumNet(NormNet):
        def forward(self, inp, tgt):  # a mean over the batch, then a sum over features
            return ((self.out(self.fc(inp)) - tgt) ** 2).mean(0).sum()


    class FeatureMeanSumNet(NormNet):
        def forward(self, inp, tgt):  # a mean over features, then a sum over the batch
            return ((self.out(self.fc(inp)) - tgt) ** 2).mean(1).sum()


    class DetachNet(NormNet):
        def forward(self, inp, tgt):  # a stop-gradient factor (a gate, a target network)
            h = self.fc(inp)
            return ((self.out(h * torch.sigmoid(h).detach()) - tgt) ** 2).mean()


    class MaskNet(NormNet):
        def forward(self, inp, tgt):
            mask = torch.ones(8, dtype=torch.bool)
            mask[0] = False  # LINE mask
            h = self.fc(inp).masked_fill(~mask, 0.5)
            return ((self.out(h) - tgt) ** 2).mean()
''')

PLAN = ('plan p\nspec "models.py:{cls}" batch 8 seq 1\nspec-optimizer sgd lr=0.1\n'
        "mesh rows=2\nsplit inp [rows, -]\nsplit tgt [rows, -]\n"
        "all-reduce grad(params) over rows op=avg\noptimizer sgd lr=0.1\n")


def plan(tmp_path: Path, cls: str) -> Path:
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    path = tmp_path / f"{cls}.tvp"
    path.write_text(PLAN.format(cls=cls), encoding="utf-8")
    return path


def test_a_hugging_face_rmsnorm_casting_to_float32_is_verified(tmp_path: Path) -> None:
    path = plan(tmp_path, "NormNet")
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason


def test_a_mask_written_in_place_is_a_located_diagnostic(tmp_path: Path) -> None:
    path = plan(tmp_path, "MaskNet")
    line = next(i for i, text in enumerate(MODELS.splitlines(), 1) if "# LINE mask" in text)
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "error"
    assert "internal error" not in verdict.reason, verdict.reason
    [found] = [d for d in verdict.diagnostics if d.code.id == "TVP305"]
    # at the line, or at the forward's `def` when torch's error names no model frame
    assert found.span.file.endswith("models.py") and line - 2 <= found.span.line <= line


POOL = ('plan p\nspec "models.py:PoolNet" batch 4 seq 4\nspec-optimizer sgd lr=0.1\n'
        "mesh rows=2, sp=2\nsplit inp [rows, sp, -]\nsplit tgt [rows, -]\n"
        "all-gather pool.in over sp dim=1 backward scatter\n"
        "all-reduce grad(proj.weight) over sp op={op}\n"
        "all-reduce grad(params) over rows op=avg\noptimizer sgd lr=0.1\n")


def test_a_sequence_gathered_before_the_loss_is_no_data_rank_of_it(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    right = tmp_path / "pool.tvp"
    right.write_text(POOL.format(op="sum"), encoding="utf-8")
    assert layout_diagnostics(right, allow_model_outside_root=True) == []
    wrong = tmp_path / "pool_avg.tvp"  # averaging the shares divides the gradient by sp
    wrong.write_text(POOL.format(op="avg"), encoding="utf-8")
    found = layout_diagnostics(wrong, allow_model_outside_root=True)
    assert (found[0].code.id, found[0].span.line) == ("TVP406", 8), found  # op=avg over sp


POST = textwrap.dedent('''\
    import torch
    from torch import nn


    class PostNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(4, 8, bias=False)
            self.mix = nn.Linear(8, 4, bias=False)
            self.out = nn.Linear(4, 4, bias=False)

        def input_specs(self, batch, seq):
            return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

        def forward(self, inp, tgt):
            y = self.mix(torch.tanh(self.up(inp))) + 1.0
            e = self.out(torch.tanh(y)) - tgt
            return (e * e).mean()
''')


def test_a_number_added_to_a_partial_sum_is_found_by_the_layout_pass(tmp_path: Path) -> None:
    """`y + 1.0` on the row-parallel output before its all-reduce adds 1 on every rank; the
    layout pass flagged a tensor operand there (and `clamp`), not a number."""
    (tmp_path / "post.py").write_text(POST, encoding="utf-8")
    path = tmp_path / "post.tvp"
    path.write_text('plan p\nspec "post.py:PostNet" batch 4 seq 1\nspec-optimizer sgd lr=0.1\n'
                    "mesh mp=2\nsplit up.weight [mp, -]\ncopy up.in over mp\n"
                    "split mix.weight [-, mp]\nall-reduce out.in over mp\n"
                    "optimizer sgd lr=0.1\n", encoding="utf-8")
    found = layout_diagnostics(path, allow_model_outside_root=True)
    first = found[0]  # (then tanh of the partial sum, TVP404, and what follows)
    assert first.code.id == "TVP405" and "the number 1" in first.message, found
    assert first.span.line == 7


def test_the_distributed_oracle_agrees_on_a_float32_cast(tmp_path: Path) -> None:
    """The oracle's single-device step and its ranks rounded the cast to float32 apart
    (relative 1e-7, reported as a difference): both run it as float64 now."""
    from trainverify_dsl.oracle import run_distributed

    result = run_distributed(str(plan(tmp_path, "NormNet")), allow_model_outside_root=True)
    assert result.error is None, result.error
    assert result.compared > 0 and result.max_rel_error < 1e-12


def test_a_factory_without_a_dtype_is_float64_in_every_eager_run(tmp_path: Path) -> None:
    """`torch.linspace(0.5, 1.5, 8)` in forward: the default dtype made it float32 in the
    eager runs, while the IR evaluates in float64, so `tvp check` and `tvp simulate` stopped
    with "the reference step's IR differs from eager torch (2.9e-08): please report it"
    (exit 2) and the oracle said "differs" on a correct plan (found by an outside user)."""
    from trainverify_dsl.oracle import run_distributed

    path = plan(tmp_path, "RampNet")
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason
    result = run_distributed(str(path), allow_model_outside_root=True)
    assert result.agrees and result.max_rel_error < 1e-12, result.summary()


BATCH_NORM = ('plan p\nspec "models.py:BatchNet" batch 8 seq 1\nspec-optimizer sgd lr=0.1\n'
              "mesh tp=2\n"
              "copy fc1.in over tp\nsplit fc1.weight [tp, -]\nsplit fc1.bias [tp]\n"
              "split bn.weight [tp]\nsplit bn.bias [tp]\n"
              "split fc2.weight [-, tp]\nall-reduce fc2.out over tp\n"
              "optimizer sgd lr=0.1\n")


def test_batch_norm_over_channels_split_by_tensor_parallelism_is_verified(
        tmp_path: Path) -> None:
    """Each tp rank normalises its own channels over the whole batch: exactly the spec's."""
    path = plan(tmp_path, "BatchNet")
    path.write_text(BATCH_NORM, encoding="utf-8")
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason


def test_batch_norm_over_a_split_batch_is_a_layout_error(tmp_path: Path) -> None:
    """Each data rank's batch statistics are its own rows': not the spec's (TVP403 at the
    split), unless the plan synchronises them, which it has no statement for."""
    path = plan(tmp_path, "BatchNet")
    found = layout_diagnostics(path, allow_model_outside_root=True)
    assert [d.code.id for d in found] == ["TVP403"]
    assert "variance along dimension 0" in found[0].message
    assert found[0].span.line == 5  # split inp [rows, -]


def test_ops_of_the_parent_between_its_blocks_are_traced_once_per_block(tmp_path: Path
                                                                        ) -> None:
    """The block-by-block trace takes the outer model around one block: with an op of the
    parent between two blocks (``h = h + relu(block(h))``) it held that op once, not once per
    block, and every check ended in an internal error (the reference step differed from
    eager torch). Such a model is traced whole; the right plan is verified and the wrong
    one is not."""
    import torch

    from trainverify_dsl.spec.trace import trace_training_step

    path = plan(tmp_path, "BetweenNet")
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason
    path.write_text(PLAN.format(cls="BetweenNet").replace("op=avg", "op=sum"), encoding="utf-8")
    assert check_file(path, allow_model_outside_root=True).verdict == "counterexample"
    namespace: dict[str, object] = {}
    exec(compile(MODELS, str(tmp_path / "models.py"), "exec"), namespace)  # noqa: S102
    model = namespace["BetweenNet"]()
    specs = {"inp": ((8, 4), torch.float32), "tgt": ((8, 4), torch.float32)}
    spec = trace_training_step(model, specs, None, reuse=True, exact_reuse=True)
    assert spec.block_list == ""
    assert any("computes between the blocks" in note for note in spec.notes), spec.notes


def test_blocks_called_with_arguments_of_their_own_are_traced_whole(tmp_path: Path) -> None:
    """A per-layer argument (``block(h, scales[k])``): the outer model around one block would
    give every block the first one's; verified, traced whole."""
    path = plan(tmp_path, "PerLayerNet")
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason


def test_yes_no_words_of_the_spec_line_reach_a_keyword_model_as_booleans(tmp_path: Path
                                                                         ) -> None:
    """A model built from keyword arguments (no named config) got `tie false` as the string
    "false", which Python reads as true: the head stayed tied. The plan's words are
    booleans, and an argument annotated `bool`, `int` or `float` takes nothing else (an
    error at the spec line)."""
    from trainverify_dsl.api import prepare
    from trainverify_dsl.spec.load import keyword_settings

    (tmp_path / "flag.py").write_text(textwrap.dedent('''\
        from __future__ import annotations

        import torch
        from torch import nn


        class FlagNet(nn.Module):
            def __init__(self, tie: bool = True, width: int = 4, plain=None):
                super().__init__()
                self.tie, self.plain = tie, plain
                self.fc = nn.Linear(width, width, bias=False)

            def input_specs(self, batch, seq):
                return {"inp": ((batch, 4), torch.float32)}

            def forward(self, inp):
                return self.fc(inp).pow(2).mean()
        '''), encoding="utf-8")
    path = tmp_path / "flag.tvp"
    text = ('plan p\nspec "flag.py:FlagNet" batch 4 seq 1 {settings}\nmesh dp=2\n'
            "split inp [dp, -]\nall-reduce grad(params) over dp op=avg\n"
            "optimizer sgd lr=0.1\n")
    path.write_text(text.format(settings="tie false plain true"), encoding="utf-8")
    model = prepare(path, real=False, allow_model_outside_root=True).fake_model
    assert model.tie is False and model.plain is True
    path.write_text(text.format(settings="tie maybe"), encoding="utf-8")
    (found,) = layout_diagnostics(path, allow_model_outside_root=True)
    assert found.code.id == "TVP303" and (found.span.file, found.span.line) == (str(path), 2)
    assert "write `tie true` or `tie false`, not 'maybe'" in found.message

    class Net:
        def __init__(self, tie: bool, width: int, scale: float, name: str = "",
                     gate: bool | None = None,
                     depth: Optional[int] = None) -> None: ...  # noqa: UP045 (a user's style)

    assert keyword_settings(Net, {"tie": "true", "width": 8.0, "scale": 1, "name": "false",
                                  "gate": "false", "depth": 3.0}) == \
        {"tie": True, "width": 8, "scale": 1.0, "name": "false", "gate": False, "depth": 3}
    for bad in ({"width": 1.5}, {"scale": "x"}, {"tie": 1}):
        with pytest.raises(ValueError):
            keyword_settings(Net, bad)


def test_a_difference_at_an_algorithms_input_is_reported_at_the_algorithm(tmp_path: Path
                                                                          ) -> None:
    """A value entering a row-parallel algorithm where no statement stands (the plan's
    column-parallel output normalised by a sum over its split features, TVP404) differs
    there: the counterexample named no plan line; it names the algorithm reading it."""
    (tmp_path / "norm.py").write_text(textwrap.dedent('''\
        import torch
        from torch import nn


        class SumNormNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.up = nn.Linear(4, 8)
                self.down = nn.Sequential(nn.GELU(), nn.Linear(8, 4))

            def input_specs(self, batch, seq):
                return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

            def forward(self, inp, tgt):
                z = self.up(inp)
                z = z / (z * z).sum(-1, keepdim=True)
                return ((self.down(z) - tgt) ** 2).mean()
        '''), encoding="utf-8")
    path = tmp_path / "norm.tvp"
    path.write_text('plan p\nspec "norm.py:SumNormNet" batch 8 seq 1\n'
                    "spec-optimizer sgd lr=0.1\nmesh rows=2, cols=2\n"
                    "split inp [rows, -]\nsplit tgt [rows, -]\n"
                    "split up.weight [cols, -]\nsplit up.bias [cols]\ncopy up.in over cols\n"
                    "split down.1.weight [-, cols]\n"
                    "algorithm row-parallel-linear for down.1 over cols\n"
                    "all-reduce grad(params) over rows op=avg\noptimizer sgd lr=0.1\n",
                    encoding="utf-8")
    found = layout_diagnostics(path, allow_model_outside_root=True)
    assert [(d.code.id, d.span.line) for d in found] == [("TVP404", 8)]
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "counterexample", verdict.reason
    found = verdict.counterexample
    assert found is not None and found.tensor == "down.1.in", found
    assert found.span is not None and found.span.line == 11, found


def test_a_mean_over_the_batch_then_a_sum_over_features_is_a_mean_loss(tmp_path: Path
                                                                        ) -> None:
    """`e.pow(2).mean(0).sum()` is (1/B) times a sum over every element: a mean over the
    batch, whose local value each data rank averages (op=avg). It was TVP414 ("ends in a
    sum over every element") with no plan that could state it. Now verified, and the gloo
    oracle agrees; op=sum is found; a mean over features then a sum over the split batch
    is still a sum over the ranks' shares (TVP414)."""
    from trainverify_dsl.oracle import run_distributed

    path = plan(tmp_path, "MeanSumNet")
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason
    oracle = run_distributed(path, allow_model_outside_root=True)
    assert oracle.agrees, oracle.differences[:3]
    path.write_text(PLAN.format(cls="MeanSumNet").replace("op=avg", "op=sum"), encoding="utf-8")
    assert [d.code.id for d in layout_diagnostics(path, allow_model_outside_root=True)] == \
        ["TVP411"]
    assert check_file(path, allow_model_outside_root=True).verdict == "counterexample"
    path = plan(tmp_path, "FeatureMeanSumNet")
    assert [d.code.id for d in layout_diagnostics(path, allow_model_outside_root=True)] == \
        ["TVP414"]


def test_a_detached_factor_gets_no_gradient_in_either_program(tmp_path: Path) -> None:
    """Core ATen's decomposition turns `detach` into `alias`, and both forwards are
    decomposed before torch differentiates them: the gradient flowed through the detached
    factor, and every check of such a model ended with "the reference step disagrees with
    eager torch ... please report it" (the gloo oracle's ranks, built the same way, said
    "differs"). `detach` is kept: verified, and the oracle agrees."""
    from trainverify_dsl.oracle import run_distributed

    path = plan(tmp_path, "DetachNet")
    assert layout_diagnostics(path, allow_model_outside_root=True) == []
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason
    assert run_distributed(path, allow_model_outside_root=True).agrees


def test_a_frozen_parameter_is_a_located_diagnostic(tmp_path: Path) -> None:
    """A parameter with `requires_grad=False` has no gradient in the single-device step:
    every command failed with an internal `KeyError: 'grad(...)'`. It is TVP314 in the model
    file (at the spec line when the line sets the model's arguments), from every command."""
    (tmp_path / "frozen.py").write_text(MODELS + textwrap.dedent('''\


        class FrozenNet(NormNet):
            def __init__(self):
                super().__init__()
                self.gain = nn.Parameter(torch.ones(4), requires_grad=False)

            def forward(self, inp, tgt):
                return ((self.out(self.fc(inp * self.gain)) - tgt) ** 2).mean()
        '''), encoding="utf-8")
    path = tmp_path / "frozen.tvp"
    path.write_text(PLAN.format(cls="FrozenNet").replace("models.py", "frozen.py"),
                    encoding="utf-8")
    (found,) = layout_diagnostics(path, allow_model_outside_root=True)
    assert found.code.id == "TVP314" and found.span.file.endswith("frozen.py"), found
    assert "`gain` does not require a gradient" in found.message
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "error" and "TVP314" in str(verdict.diagnostics), verdict


def test_a_backward_of_the_models_own_and_a_no_grad_parameter_are_explained(
        tmp_path: Path) -> None:
    """A straight-through estimator (an autograd Function whose backward is the identity)
    and a parameter read only under `torch.no_grad()` are not the step the checker
    differentiates: the reference check refuses them (no verdict), saying which it is
    rather than only "please report it"."""
    (tmp_path / "own.py").write_text(MODELS + textwrap.dedent('''\


        class Sign(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return torch.sign(x)

            @staticmethod
            def backward(ctx, g):
                return g


        class SteNet(NormNet):
            def forward(self, inp, tgt):
                h = self.fc(inp)
                return ((self.out(Sign.apply(h) + 0.1 * h) - tgt) ** 2).mean()


        class NoGradNet(NormNet):
            def __init__(self):
                super().__init__()
                self.gain = nn.Parameter(torch.ones(8))

            def forward(self, inp, tgt):
                with torch.no_grad():
                    s = self.gain.sum()
                return ((self.out(self.fc(inp) * s) - tgt) ** 2).mean()
        '''), encoding="utf-8")
    for cls, says in (("SteNet", "a backward of its own"),
                      ("NoGradNet", "eager torch gives `gain` no gradient")):
        path = tmp_path / f"{cls}.tvp"
        path.write_text(PLAN.format(cls=cls).replace("models.py", "own.py"), encoding="utf-8")
        verdict = check_file(path, allow_model_outside_root=True)
        assert verdict.verdict == "error" and says in verdict.reason, verdict.reason


def test_a_classifiers_labels_are_drawn_in_range_of_its_classes(tmp_path: Path) -> None:
    """Three classes beside an embedding of 13 rows: cross-entropy's labels reach the logits'
    gather through `where(target != ignore_index, target, 0)`, which the range analysis did
    not follow, so they were drawn up to 13 and every command ended in an internal
    IndexError. Drawn below 3 now: under `token-mean` the plan is verified."""
    (tmp_path / "cls.py").write_text(textwrap.dedent('''\
        import torch
        import torch.nn.functional as F
        from torch import nn


        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(13, 8)
                self.fc = nn.Linear(8, 3)

            def input_specs(self, batch, seq):
                return {"ids": ((batch, seq), torch.int64), "label": ((batch,), torch.int64)}

            def forward(self, ids, label):
                return F.cross_entropy(self.fc(self.emb(ids).mean(1)), label)
        '''), encoding="utf-8")
    path = tmp_path / "cls.tvp"
    path.write_text('plan p\nspec "cls.py:Classifier" batch 8 seq 4\n'
                    "spec-optimizer sgd lr=0.1\nmesh rows=2\nloss-reduction token-mean\n"
                    "split ids [rows, -]\nsplit label [rows]\n"
                    "all-reduce grad(params) over rows op=sum\noptimizer sgd lr=0.1\n",
                    encoding="utf-8")
    verdict = check_file(path, allow_model_outside_root=True)
    assert verdict.verdict == "verified", verdict.reason


@pytest.mark.parametrize("specs", ['{"x": "not a tuple"}', "None",
                                   '{"x": ((batch, -4), torch.float32)}',
                                   '{"x": ((batch, 4), "float32")}'])
def test_malformed_input_specs_are_a_diagnostic_at_the_spec_line(tmp_path: Path, specs: str
                                                                  ) -> None:
    """`input_specs` returning something other than `{name: (shape, dtype)}` ended every
    plan command in an internal error (`too many values to unpack`), and `api.check`
    raised; only `tvp spec` said TVP307."""
    from trainverify_dsl.api import check

    (tmp_path / "odd.py").write_text(textwrap.dedent(f'''\
        import torch
        from torch import nn


        class Odd(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def input_specs(self, batch, seq):
                return {specs}

            def forward(self, x):
                return self.fc(x).mean()
        '''), encoding="utf-8")
    path = tmp_path / "odd.tvp"
    path.write_text('plan p\nspec "odd.py:Odd" batch 8\nmesh dp=2\nsplit x [dp, -]\n'
                    "all-reduce grad(params) over dp op=avg\n", encoding="utf-8")
    [error] = layout_diagnostics(path, allow_model_outside_root=True)
    assert error.code.id == "TVP307" and error.span.line == 2, error
    assert check(path, allow_model_outside_root=True).verdict == "error"


def test_a_forward_that_returns_no_scalar_loss_is_found_by_the_layout_pass(tmp_path: Path
                                                                          ) -> None:
    """`tvp lint --spec` said "no issues found" for a model returning an (8, 2) tensor that
    `check` and `simulate` refuse (TVP306): the layout pass checks the output as the tracer
    does."""
    (tmp_path / "odd.py").write_text(textwrap.dedent('''\
        import torch
        from torch import nn


        class Odd(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def input_specs(self, batch, seq):
                return {"x": ((batch, 4), torch.float32)}

            def forward(self, x):
                return self.fc(x)
        '''), encoding="utf-8")
    path = tmp_path / "odd.tvp"
    path.write_text('plan p\nspec "odd.py:Odd" batch 8\nmesh dp=2\nsplit x [dp, -]\n'
                    "all-reduce grad(params) over dp op=avg\n", encoding="utf-8")
    [error] = layout_diagnostics(path, allow_model_outside_root=True)
    assert error.code.id == "TVP306" and "scalar training loss" in error.message


def test_a_torch_error_while_building_the_model_is_quoted_without_its_cpp_backtrace(
        tmp_path: Path) -> None:
    """`d_in 99999999999999999999` on the spec line: torch's overflow error carries its
    C++ backtrace ("frame #0: c10::Error::Error ..."), which TVP303 quoted whole."""
    (tmp_path / "wide.py").write_text(textwrap.dedent('''\
        import torch
        from torch import nn


        class Wide(nn.Module):
            def __init__(self, d_in: int = 4):
                super().__init__()
                self.fc = nn.Linear(d_in, 2)

            def input_specs(self, batch, seq):
                return {"x": ((batch, 4), torch.float32)}

            def forward(self, x):
                return self.fc(x).mean()
        '''), encoding="utf-8")
    path = tmp_path / "wide.tvp"
    path.write_text('plan p\nspec "wide.py:Wide" batch 8 d_in 99999999999999999999\n'
                    "mesh dp=2\nsplit x [dp, -]\nall-reduce grad(params) over dp op=avg\n",
                    encoding="utf-8")
    [error] = layout_diagnostics(path, allow_model_outside_root=True)
    assert error.code.id == "TVP303" and "constructing Wide failed" in error.message
    assert "frame #" not in error.message and "Exception raised from" not in error.message


NAMED = textwrap.dedent('''\
    import torch
    from torch import nn


    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_parameter("NAME", nn.Parameter(torch.ones(4, 4) * 0.3))

        def input_specs(self, batch, seq):
            return {"x": ((batch, 4), torch.float32), "y": ((batch, 4), torch.float32)}

        def forward(self, x, y):
            return ((self.fc(x) @ getattr(self, "NAME") - y) ** 2).mean()
''')


@pytest.mark.parametrize("name,verdict", [("out", "verified"), ("labels", "verified"),
                                          ("in", "error"), ("loss", "error")])
def test_a_parameter_name_means_nothing_to_params(tmp_path: Path, name: str, verdict: str
                                                  ) -> None:
    """`grad(params)` left out a parameter named `out` or `in` (or starting `tokens`,
    `labels`), read as a module boundary or a model input: a correct data-parallel plan was
    a counterexample (TVP410). A parameter named with a Python keyword ended in an internal
    error inside torch.export, one named `loss` in an IR error; both are TVP315 now."""
    (tmp_path / "named.py").write_text(NAMED.replace("NAME", name), encoding="utf-8")
    path = tmp_path / "named.tvp"
    path.write_text('plan p\nspec "named.py:Named" batch 4\nspec-optimizer sgd lr=0.1\n'
                    "mesh dp=2\nsplit x [dp, -]\nsplit y [dp, -]\n"
                    "all-reduce grad(params) over dp op=avg\noptimizer sgd lr=0.1\n",
                    encoding="utf-8")
    found = check_file(path, allow_model_outside_root=True)
    assert found.verdict == verdict, (found.reason, [d.message for d in found.diagnostics])
    if verdict == "error":
        assert [d.code.id for d in found.diagnostics] == ["TVP315"]
