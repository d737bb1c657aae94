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
    """Layer type: GCN (symmetric normalisation), GraphSAGE (mean) or GAT (multi-head).
    Mini-batch runs train GraphSAGE: a mini-batch run whose TOML and flags (or the API's
    options) name no model gets ``sage``; a :class:`RunConfig` built in Python says what it says."""
    layers: int = 2
    """Number of message-passing layers L (each one halo exchange forward and back); with
    ``residual = "res+"`` the number of residual blocks (the encoder and decoder are extra,
    row-local linear maps)."""
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
    residual: Literal["none", "res+"] = "none"
    """``none``: the plain stack of ``layers`` graph convolutions. ``res+``: DeeperGCN's
    pre-activation residual blocks (:class:`commgnn.models.deep.ResPlusGNN`): a linear
    encoder ``F -> hidden``, ``layers`` blocks ``h = h + conv(dropout(act(norm(h))))`` of
    hidden width (GCN or SAGE, LayerNorm) and a linear decoder ``hidden -> C``; ``layers``
    still counts graph convolutions, hence halo exchanges."""
    norm: Literal["none", "layer"] = "none"
    """Between layers of the plain stack: ``layer`` normalises each node's hidden row
    (``LayerNorm`` with its affine weights, as BNS-GCN's default ``--norm layer``) before the
    activation. Row-local: it adds parameters, not traffic. (``res+`` blocks always carry
    their own LayerNorm.)"""
    checkpoint: bool = False
    """``res+``: activation checkpointing of every residual block (``torch.utils.checkpoint``,
    non-reentrant): a block keeps only its input and its received halo rows, and is
    recomputed in the backward pass from those (no second exchange). Less memory, more
    compute; the same numbers."""

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
        if self.activation == "maxk" and self.hidden > 65536:  # halo indices travel as 16 bits
            raise ConfigError(f"model.activation = 'maxk' sends 16-bit column indices: model.hidden must be at "
                              f"most 65536, got {self.hidden}")
        if self.activation == "maxk" and self.maxk_k > self.hidden:
            raise ConfigError(f"model.maxk_k ({self.maxk_k}) cannot exceed model.hidden ({self.hidden})")
        if self.name == "gat" and self.hidden % self.heads:
            raise ConfigError(f"model.hidden ({self.hidden}) must be divisible by model.heads "
                              f"({self.heads}) for GAT")
        if self.norm not in ("none", "layer"):
            raise ConfigError(f"model.norm must be 'none' or 'layer', got {self.norm!r}")
        if self.norm != "none" and self.residual != "none":
            raise ConfigError("model.norm is for the plain stack; res+ blocks carry their own LayerNorm: "
                              "drop model.norm or set model.residual = 'none'")
        if self.residual not in ("none", "res+"):
            raise ConfigError(f"model.residual must be 'none' or 'res+', got {self.residual!r}")
        if self.residual == "res+" and self.name == "gat":
            raise ConfigError("model.residual = 'res+' builds its blocks from GCN or GraphSAGE layers; "
                              "use model.name = 'gcn' or 'sage', or residual = 'none' for GAT")
        if self.checkpoint and self.residual == "none":
            raise ConfigError("model.checkpoint recomputes residual blocks in the backward pass and the plain "
                              "model has none: set model.residual = 'res+' or drop model.checkpoint")
