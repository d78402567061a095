"""Small models with a list of blocks named `blocks` (not `layers`): a long skip from the
first module to the head (tests/test_send_restated.py) and a weight shared by two blocks
(tests/test_tied_blocks.py)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.lin = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.lin(x))


class BlockNet(nn.Module):
    """``inp [batch, d]`` -> ``proj`` -> blocks -> ``head``; the mean squared error against
    ``lbl``."""

    def __init__(self, d: int = 4, hid: int = 8, n_blocks: int = 4) -> None:
        super().__init__()
        self.d = d
        self.proj = nn.Linear(d, hid, bias=False)
        self.blocks = nn.ModuleList([Block(hid) for _ in range(n_blocks)])
        self.head = nn.Linear(hid, d, bias=False)

    def input_specs(self, batch: int, seq: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        dt = torch.get_default_dtype()
        return {"inp": ((batch, self.d), dt), "lbl": ((batch, self.d), dt)}

    def trunk(self, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.proj(inp)
        h = first
        for block in self.blocks:
            h = block(h)
        return first, h

    def forward(self, inp: torch.Tensor, lbl: torch.Tensor) -> torch.Tensor:
        _, h = self.trunk(inp)
        err = self.head(h) - lbl
        return (err * err).mean()


class SkipNet(BlockNet):
    """``proj``'s output is used by the first block and again at the head (a long skip)."""

    def forward(self, inp: torch.Tensor, lbl: torch.Tensor) -> torch.Tensor:
        first, h = self.trunk(inp)
        err = self.head(h * first) - lbl
        return (err * err).mean()


class TiedNet(BlockNet):
    """The last block's weight is the first block's (cross-layer sharing, as ALBERT's)."""

    def __init__(self, d: int = 4, hid: int = 8, n_blocks: int = 4) -> None:
        super().__init__(d, hid, n_blocks)
        self.blocks[n_blocks - 1].lin.weight = self.blocks[0].lin.weight
