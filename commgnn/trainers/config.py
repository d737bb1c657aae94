"""Training-loop configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args, get_type_hints

import torch

from commgnn import kernels
from commgnn.config import fraction, positive
from commgnn.errors import ConfigError


SEED_LIMIT = 2**32
"""``train.seed`` lies in ``[0, SEED_LIMIT)``: derived seeds (per rank, per lever: ``seed *
1_000_003 + rank``) must stay inside the 64-bit range ``torch.manual_seed`` takes."""

STREAMS = {"train": 1, "fetch": 2, "owner": 3, "presample": 4, "eval": 5, "eval_pick": 6}
"""The random streams of one rank in mini-batch training, by purpose."""


def stream_seed(seed: int, rank: int, purpose: str) -> int:
    """The seed of rank ``rank``'s ``purpose`` stream (:data:`STREAMS`): ``(seed * 1_000_003 +
    rank) * 16 + STREAMS[purpose]``, distinct for every (seed, rank < 1,000,003, purpose), so
    that no stream of one rank repeats another rank's (offsets such as ``rank + 7`` made rank
    r + 7's pre-sampling draw rank r's training samples)."""
    return (seed * 1_000_003 + rank) * 16 + STREAMS[purpose]


_DTYPE_MAX = {"float32": float(torch.finfo(torch.float32).max), "float64": float(torch.finfo(torch.float64).max)}
"""Largest learning rate / weight decay the optimiser can apply to parameters of each dtype."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and stopping."""

    @property
    def resolved_kernel(self) -> str:
        """The kernel in force: ``auto`` resolved against what is installed and the mode.
        Mini-batch training takes torch's: its per-step blocks are small and rebuilt every
        step, and with numba in force 4 ranks on 2 cores ran Coauthor CS's neighbour-sampling
        epochs 2.3-2.8x slower (12.8-15.2 s against 5.5 s; `benchmarks/minibatch_kernel_probe.sh`)."""
        if self.kernel == "auto":
            return "numba" if kernels.available() and self.mode == "fullgraph" else "torch"
        return self.kernel

    mode: Literal["fullgraph", "minibatch"] = "fullgraph"
    """``fullgraph``: one step per epoch on the whole graph (exact halo exchange and its
    levers); ``minibatch``: sampled batches (``[minibatch]``, ``[fetch]``), the same number
    of steps on every rank."""
    epochs: int = 200
    """Maximum number of epochs (one full-graph step each, or one pass over the training
    nodes in mini-batches)."""
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
    Changes compute; without ``precompute`` or ``transform_first`` it also moves the halo's
    input rows once before training, to learn their non-zero pattern (``halo_setup``, sent
    sparse under ``comm.halo.sparse_setup``)."""
    kernel: Literal["auto", "torch", "numba"] = "auto"
    """Aggregation kernels on CPU: ``torch`` (``torch.sparse.mm`` and PyG's edge softmax),
    ``numba`` (the fused loops of :mod:`commgnn.kernels`; needs ``pip install
    commgnn[kernels]``), ``auto`` = numba when it is installed, in full-graph training
    (mini-batch training: torch). Changes only compute (and summation order), not what is sent."""

    on_nonfinite: Literal["stop", "skip_step"] = "stop"
    """What a step whose loss or a gradient is NaN or infinite does: ``stop`` ends the run at
    that epoch (exit code 1, ``status.json`` ``failed``, one line naming the epoch and the
    first non-finite quantity; the last good checkpoint is kept); ``skip_step`` applies no
    update for that step on any rank and goes on."""

    def __post_init__(self) -> None:
        # a config built in Python skips from_dict's type check: the choices come from the annotations
        _check_choices(self, "on_nonfinite", "kernel")
        if self.kernel == "numba" and not kernels.available():
            raise ConfigError("train.kernel = 'numba' needs numba: pip install 'commgnn[kernels]' "
                              "(or set train.kernel = 'auto' to fall back to torch)")
        _check_choices(self, "mode")
        positive("train.epochs", self.epochs)
        positive("train.lr", self.lr)
        if self.dtype in _DTYPE_MAX:
            for key in ("lr", "weight_decay"):
                value = getattr(self, key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > _DTYPE_MAX[self.dtype]:
                    raise ConfigError(f"train.{key} = {value:g} does not fit train.dtype = '{self.dtype}' "
                                      f"(at most {_DTYPE_MAX[self.dtype]:g})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError(f"train.seed must be an integer in [0, 2**32), got {self.seed!r:.40}")
        fraction("train.momentum", self.momentum, open_high=True)
        _check_choices(self, "optimizer", "schedule")
        positive("train.weight_decay", self.weight_decay, allow_zero=True)
        positive("train.patience", self.patience, allow_zero=True)


def _check_choices(cfg: Any, *names: str) -> None:
    """Each field in ``names`` of ``cfg`` holds one of its ``Literal`` annotation's values
    (a one-line :class:`ConfigError` naming the choices otherwise)."""
    hints = get_type_hints(type(cfg))
    for name in names:
        choices = [repr(c) for c in get_args(hints[name])]
        value = getattr(cfg, name)
        if value not in get_args(hints[name]):
            raise ConfigError(f"train.{name} must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}")
