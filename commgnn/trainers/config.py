"""Training-loop configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and stopping of full-graph training."""

    epochs: int = 200
    """Maximum number of epochs (one full-graph step each)."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """``adam`` (torch's Adam) or ``sgd`` (torch's SGD with ``momentum``)."""
    lr: float = 0.01
    """Learning rate (the peak one under a schedule)."""
    momentum: float = 0.9
    """Heavy-ball momentum of ``sgd`` (ignored by Adam)."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule: ``cosine`` decays it to 0 over ``epochs`` (torch's
    ``CosineAnnealingLR``), which lets compressed and decentralised runs settle: their
    error and the ranks' disagreement both scale with the step size."""
    weight_decay: float = 5e-4
    """L2 weight decay (added to the gradient by the optimiser)."""
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
        fraction("train.momentum", self.momentum, open_high=True)
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"train.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.schedule not in ("constant", "cosine"):
            raise ConfigError(f"train.schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        positive("train.weight_decay", self.weight_decay, allow_zero=True)
        positive("train.patience", self.patience, allow_zero=True)
