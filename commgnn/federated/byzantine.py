"""Byzantine attack harness: replace the updates of chosen clients with adversarial ones.

A test or benchmark builds honest updates [n, d], picks f client indices as Byzantine and
calls :func:`apply_attacks`, which returns a copy whose Byzantine rows are the attack's
output; the honest rows are untouched. Attacks see the Byzantine clients' own honest
updates and, for omniscient attacks, the honest clients' updates too.

Attacks (each a row-wise map, so a Byzantine client needs only its own update):

* :class:`ScaleAttack` (factor a): u_i <- a u_i; a = -10 sends a boosted, reversed update.
* :class:`SignFlip`: u_i <- -u_i.
* :class:`GaussianNoise` (std s): u_i <- N(0, s^2 I_d), a random update unrelated to training.

Hand-written: these are the standard attacks of the robust-aggregation literature
(e.g. Blanchard et al. 2017, Allen-Zhu et al. 2020), one line each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from commgnn.errors import ConfigError


@runtime_checkable
class Attack(Protocol):
    """Forge the updates of the Byzantine clients."""

    def __call__(self, own: Tensor, honest: Tensor, generator: torch.Generator | None) -> Tensor:
        """Forged updates [f, d] from the Byzantine clients' own honest updates ``own`` [f, d]
        and the honest clients' updates ``honest`` [n - f, d]."""
        ...


@dataclass(frozen=True)
class ScaleAttack:
    """Send ``factor`` times one's honest update (e.g. -10: boosted and reversed)."""

    factor: float = -10.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.factor):
            raise ConfigError(f"ScaleAttack: factor must be finite, got {self.factor}")

    def __call__(self, own: Tensor, honest: Tensor, generator: torch.Generator | None) -> Tensor:
        return own * self.factor


@dataclass(frozen=True)
class SignFlip:
    """Send the negated honest update."""

    def __call__(self, own: Tensor, honest: Tensor, generator: torch.Generator | None) -> Tensor:
        return -own


@dataclass(frozen=True)
class GaussianNoise:
    """Send pure noise N(0, std^2 I_d) instead of an update."""

    std: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.std) and self.std > 0):
            raise ConfigError(f"GaussianNoise: std must be a finite number > 0, got {self.std}")

    def __call__(self, own: Tensor, honest: Tensor, generator: torch.Generator | None) -> Tensor:
        return torch.randn(own.shape, generator=generator, dtype=own.dtype, device=own.device) * self.std


def apply_attacks(updates: Tensor, byzantine: Sequence[int], attack: Attack,
                  generator: torch.Generator | None = None) -> Tensor:
    """A copy of ``updates`` [n, d] whose rows ``byzantine`` (distinct client indices) are
    replaced by ``attack``'s forgeries; the other rows are the honest ones, unchanged."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [n, d], got shape {tuple(updates.shape)}")
    n = updates.shape[0]
    idx = list(byzantine)
    for i in idx:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ConfigError(f"Byzantine client {i!r} is not a client index in [0, {n})")
    if len(set(idx)) != len(idx):
        raise ConfigError(f"Byzantine clients must be distinct, got {idx}")
    out = updates.clone()
    if not idx:
        return out
    mask = torch.zeros(n, dtype=torch.bool, device=updates.device)
    rows = torch.tensor(idx, dtype=torch.long, device=updates.device)
    mask[rows] = True
    forged = attack(updates[rows], updates[~mask], generator)
    if forged.shape != (len(idx), updates.shape[1]):
        raise ValueError(f"attack returned shape {tuple(forged.shape)}, expected {(len(idx), updates.shape[1])}")
    out[rows] = forged.to(out.dtype)
    return out
