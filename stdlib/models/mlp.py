"""A two-layer perceptron with a mean-squared-error loss: the smallest reference spec."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stdlib.models.common import InputSpecs, load_config

ACTIVATIONS = ("gelu", "relu")


@dataclasses.dataclass(frozen=True, slots=True)
class MLPConfig:
    d_in: int
    d_hidden: int
    d_out: int
    activation: str = "gelu"
    n_layers: int = 0  # no repeated blocks; present because every config carries n_layers

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, not {self.activation!r}")
        if self.n_layers != 0:
            raise ValueError("an MLP has no repeated layers: n_layers must be 0")


class MLP(nn.Module):
    """fc2(act(fc1(x))), loss = mean((prediction - target)^2)."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        self.fc1 = nn.Linear(config.d_in, config.d_hidden, bias=True)
        self.fc2 = nn.Linear(config.d_hidden, config.d_out, bias=True)

    @classmethod
    def from_config_name(cls, name: str, **overrides: Any) -> MLP:
        return cls(load_config(MLPConfig, name, "MLP", overrides))

    def input_specs(self, batch: int, seq: int) -> InputSpecs:
        """`x [batch, d_in]` and `target [batch, d_out]`; `seq` is ignored."""
        dtype = torch.get_default_dtype()
        return {
            "x": ((batch, self.config.d_in), dtype),
            "target": ((batch, self.config.d_out), dtype),
        }

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1(x)
        hidden = F.relu(hidden) if self.config.activation == "relu" else F.gelu(hidden)
        return self.fc2(hidden)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = self.predict(x) - target
        return (error * error).mean()
