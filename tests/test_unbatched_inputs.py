"""Model inputs whose dimension 0 is not the batch (docs/semantics.md Rule 4.1): a
per-feature scale, a table passed in. Session 19's outside user: with microbatches the
lowering cut the scale's 8 features into 2 microbatch pieces, and a correct plan was TVP403
("an operand split as [4/@mb,dp, 4, 8] meets one split as [4/@mb,dp, 4, 8/@mb]"). Now
`input_specs` at two batch sizes says which inputs follow the batch; the others are read
whole by every microbatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.spec.load import unbatched_inputs

MODEL = '''import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(8, 8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8, bias=False)

    def input_specs(self, batch, seq):
        return {"inp": ((batch, seq), torch.int64), "tgt": ((batch, seq), torch.int64),
                "scale": ((8,), torch.float32)}

    def forward(self, inp, tgt, scale):
        h = self.emb(inp) * scale
        h = h + torch.tanh(self.fc(h))
        logp = torch.log_softmax(self.head(h), dim=-1)
        return -logp.gather(-1, tgt[..., None]).mean()
'''

PLAN = '''plan scaled
spec "scaled.py:Scaled" batch 4 seq 4
spec-optimizer sgd lr=0.1
mesh dp=2
microbatches 2
loss-scale 1/microbatches
split inp [dp, -]
split tgt [dp, -]
SCALE
all-reduce grad(params) over dp op=avg
optimizer sgd lr=0.1
'''


def plan(tmp_path: Path, scale: str) -> Path:
    (tmp_path / "scaled.py").write_text(MODEL)
    path = tmp_path / "scaled.tvp"
    path.write_text(PLAN.replace("SCALE", scale))
    return path


def test_an_input_without_a_batch_dimension_is_read_whole_by_every_microbatch(
        tmp_path: Path) -> None:
    path = plan(tmp_path, "replicate scale")
    assert api.layout_diagnostics(path) == []
    assert api.simulate_file(path).agrees
    assert api.check_file(path, cache=False).verdict == "verified"
    # the same plan without its loss scale still differs: the microbatches are there
    wrong = tmp_path / "wrong.tvp"
    wrong.write_text(path.read_text().replace("loss-scale 1/microbatches\n", ""))
    assert not api.simulate_file(wrong, stop_on_errors=False).agrees


def test_which_inputs_follow_the_batch() -> None:
    from trainverify_dsl.spec.load import load_model

    namespace: dict = {}
    exec(compile(MODEL, "scaled.py", "exec"), namespace)  # noqa: S102 - the test's own model
    assert unbatched_inputs(namespace["Scaled"]()) == {"scale"}
    llama = load_model("stdlib/models/llama.py:Llama", "llama_tiny", fake=True)
    assert unbatched_inputs(llama) == frozenset()


@pytest.mark.parametrize("scale", ["split scale [dp]"])
def test_splitting_such_an_input_over_the_data_axis_is_a_layout_error(
        tmp_path: Path, scale: str) -> None:
    path = plan(tmp_path, scale)
    assert "TVP403" in [d.code.id for d in api.layout_diagnostics(path)]
