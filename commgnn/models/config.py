"""Model configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of the GNN (the same for the partitioned model and the PyG reference)."""

    name: Literal["gcn", "sage", "gat"] = "gcn"
    """Layer type: GCN (symmetric normalisation), GraphSAGE (mean) or GAT (multi-head)."""
    layers: int = 2
    """Number of message-passing layers L (each one halo exchange forward and back)."""
    hidden: int = 64
    """Hidden width; for GAT the concatenated width of all heads (per-head = hidden / heads)."""
    dropout: float = 0.5
    """Dropout on every layer's input, applied by the owner before the halo exchange, so a
    node has one mask everywhere, as in single-process training."""
    heads: int = 8
    """GAT attention heads of hidden layers (the output layer has one head)."""
    attn_dropout: float = 0.0
    """GAT dropout on attention coefficients."""
    activation: Literal["auto", "relu", "elu", "maxk"] = "auto"
    """Between layers: ``auto`` = ReLU (ELU for GAT); ``maxk`` keeps each row's ``maxk_k``
    largest entries (MaxK-GNN), and then halo rows travel as k (index, value) pairs."""
    maxk_k: int = 32
    """maxk: entries kept per row (at most ``hidden``)."""

    @property
    def act(self) -> str:
        """The activation in force (``auto`` resolved)."""
        if self.activation == "auto":
            return "elu" if self.name == "gat" else "relu"
        return self.activation

    def __post_init__(self) -> None:
        positive("model.layers", self.layers)
        positive("model.hidden", self.hidden)
        positive("model.heads", self.heads)
        fraction("model.dropout", self.dropout, open_high=True)
        fraction("model.attn_dropout", self.attn_dropout, open_high=True)
        if self.activation not in ("auto", "relu", "elu", "maxk"):
            raise ConfigError(f"model.activation must be 'auto', 'relu', 'elu' or 'maxk', got {self.activation!r}")
        positive("model.maxk_k", self.maxk_k)
        if self.activation == "maxk" and self.maxk_k > self.hidden:
            raise ConfigError(f"model.maxk_k ({self.maxk_k}) cannot exceed model.hidden ({self.hidden})")
        if self.name == "gat" and self.hidden % self.heads:
            raise ConfigError(f"model.hidden ({self.hidden}) must be divisible by model.heads "
                              f"({self.heads}) for GAT")
