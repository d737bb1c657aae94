"""Training-loop configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commgnn.config import positive


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and stopping of full-graph training."""

    epochs: int = 200
    """Maximum number of epochs (one full-graph step each)."""
    lr: float = 0.01
    """Adam learning rate."""
    weight_decay: float = 5e-4
    """Adam L2 weight decay."""
    patience: int = 100
    """Stop when validation accuracy has not improved for this many epochs; 0 = never."""
    seed: int = 0
    """Seed of weight initialisation (identical on all ranks) and of dropout (per rank)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Floating-point type of features, weights and messages."""
    sparse_input: Literal["auto", "on", "off"] = "auto"
    """Compute the first layer's linear maps on the input's non-zero pattern
    (:mod:`commgnn.models.sparse`); ``auto`` = when under 10% of the input is non-zero.
    Changes only compute, not what is sent."""

    def __post_init__(self) -> None:
        positive("train.epochs", self.epochs)
        positive("train.lr", self.lr)
        positive("train.weight_decay", self.weight_decay, allow_zero=True)
        positive("train.patience", self.patience, allow_zero=True)
