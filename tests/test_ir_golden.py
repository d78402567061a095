"""Golden text of the traced IR of a small residual block model (``tests/golden/ir/``).

The canonical text (no origins) and the text with origin comments (torch module paths and
phases) are compared with the stored files. Regenerate after an intended change with
``python tests/test_ir_golden.py --update`` and review the diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainverify_dsl.ir import format_program  # noqa: E402
from trainverify_dsl.spec.trace import trace_training_step  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "ir"


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.down = nn.Linear(8, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ResidualMLP() for _ in range(2))
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return (x * self.scale).pow(2).mean()


def texts() -> dict[str, str]:
    spec = trace_training_step(Stack(), {"x": ((2, 4), torch.float32)})
    return {"residual_mlp.ir": format_program(spec.program),
            "residual_mlp.origins.ir": format_program(spec.program, origins=True)}


def test_printed_ir_matches_golden() -> None:
    for name, text in texts().items():
        expected = (GOLDEN / name).read_text(encoding="utf-8")
        assert text == expected, f"{name} changed; rerun with --update and review the diff"


def test_golden_names_every_layer_call() -> None:
    text = (GOLDEN / "residual_mlp.ir").read_text(encoding="utf-8")
    for layer in (0, 1):
        assert f'"layers.{layer}.up.weight"' in text
        assert f'"grad(layers.{layer}.down.weight)"' in text


if __name__ == "__main__" and "--update" in sys.argv:
    for file_name, content in texts().items():
        (GOLDEN / file_name).write_text(content, encoding="utf-8")
        print(f"wrote {GOLDEN / file_name}")
