"""Byzantine-robust aggregation of client updates.

Each aggregator maps the stacked updates of n clients, ``updates`` [n, d] (one flat update
per row), and optional per-client ``weights`` [n] to one update [d]:

* :class:`Mean`: sum_i w_i u_i / sum_i w_i (FedAvg; uniform without weights). One
  Byzantine client moves it arbitrarily far.
* :class:`CoordinateMedian`: per coordinate j, the median of u_1j..u_nj (for even n the
  mean of the two middle values). Each coordinate stays within the honest clients'
  range while f < n / 2 (Yin et al. 2018).
* :class:`TrimmedMean`: per coordinate, drop the k = floor(beta n) largest and k smallest
  values and average the remaining n - 2k (Yin et al. 2018). Within the honest range
  while f <= k; needs 2k < n.
* :class:`Krum`: score_i = sum of squared distances from u_i to its n - f - 2 nearest other
  updates; return the update with the lowest score, or with ``m > 1`` the mean of the m
  lowest-scoring ones (multi-Krum), Blanchard et al. 2017. Needs n > 2f + 2.

The robust aggregators ignore ``weights``: a client's claimed sample count is as
untrusted as its update, and weighting by it would let one liar dominate. Non-finite
entries (a NaN from a faulty client) are handled: sorting puts NaN last, so the median and
the trimmed mean absorb up to their tolerance of them, and Krum gives NaN distances an
infinite score. :class:`Mean` propagates them, as it should.

All are vectorised: one sort along dim 0 (O(n d log n)) or one pairwise-distance matrix
(``torch.cdist``, O(n^2 d)), which is cheap for the tens of clients of a federation.

Hand-written because there is no maintained, framework-free torch library for these:
Flower's ``FedMedian`` / ``FedTrimmedAvg`` / ``Krum`` strategies are bound to its
server and NumPy parameter lists, ``blades`` is unmaintained since 2023 and ``byzfl`` is a
0.0.x research package with its own training stack; each aggregator is a few lines of torch.

Robust aggregation needs each client's update, which secure aggregation hides from the
server: the two do not combine (``Policy.check_plan`` refuses the pair).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from commgnn.errors import ConfigError


@runtime_checkable
class Aggregator(Protocol):
    """Combine client updates [n, d] (and optional weights [n]) into one update [d]."""

    name: str

    def validate(self, n: int) -> None:
        """Raise a :class:`ConfigError` when ``n`` clients are too few for this aggregator."""
        ...

    def aggregate(self, updates: Tensor, weights: Tensor | None = None) -> Tensor:
        """The aggregate [d] of ``updates`` [n, d]."""
        ...


def _check_updates(updates: Tensor, weights: Tensor | None) -> None:
    """Shape checks shared by every aggregator (these are programming errors)."""
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be [n, d] with n >= 1, got shape {tuple(updates.shape)}")
    if weights is not None and tuple(weights.shape) != (updates.shape[0],):
        raise ValueError(f"weights must be [n] = [{updates.shape[0]}], got shape {tuple(weights.shape)}")


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class Mean:
    """Weighted mean (FedAvg); not robust: the baseline."""

    name: str = "mean"

    def validate(self, n: int) -> None:
        """Any n >= 1 works."""
        _check_int("number of clients", n, 1)

    def aggregate(self, updates: Tensor, weights: Tensor | None = None) -> Tensor:
        """sum_i w_i u_i / sum_i w_i (uniform weights when ``weights`` is None)."""
        _check_updates(updates, weights)
        if weights is None:
            return updates.mean(dim=0)
        w = weights.to(device=updates.device, dtype=updates.dtype)
        if (w < 0).any() or not float(w.sum()) > 0:
            raise ValueError("weights must be >= 0 with a positive sum")
        return (w[:, None] * updates).sum(dim=0) / w.sum()


@dataclass(frozen=True)
class CoordinateMedian:
    """Coordinate-wise median (the mean of the two middle values for even n)."""

    name: str = "median"

    def validate(self, n: int) -> None:
        """Any n >= 1 works (robust to f < n / 2)."""
        _check_int("number of clients", n, 1)

    def aggregate(self, updates: Tensor, weights: Tensor | None = None) -> Tensor:
        """Per-coordinate median of ``updates``; ``weights`` are ignored (module docstring)."""
        _check_updates(updates, weights)
        n = updates.shape[0]
        # torch.median returns the lower middle value for even n, and torch.quantile has an
        # input-size limit; a sort gives the symmetric median for any size.
        s = updates.sort(dim=0).values
        if n % 2:
            return s[n // 2].clone()
        return (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True)
class TrimmedMean:
    """Coordinate-wise beta-trimmed mean."""

    beta: float = 0.1
    """Fraction of clients trimmed at each end per coordinate (k = floor(beta n)); 0.5 with
    odd n leaves only the middle value (the median), with even n nothing (an error)."""
    name: str = "trimmed_mean"

    def __post_init__(self) -> None:
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not 0 <= self.beta <= 0.5:
            raise ConfigError(f"trimmed_mean: beta must lie in [0, 0.5], got {self.beta!r}")

    def trimmed(self, n: int) -> int:
        """k = floor(beta n): values dropped at each end of every coordinate."""
        # The small epsilon keeps e.g. 0.3 * 10 = 2.9999999999999996 from flooring to 2.
        return math.floor(self.beta * n + 1e-9)

    def validate(self, n: int) -> None:
        """Needs 2 floor(beta n) < n (something left to average)."""
        _check_int("number of clients", n, 1)
        k = self.trimmed(n)
        if 2 * k >= n:
            raise ConfigError(f"trimmed_mean: beta={self.beta} trims all {n} clients (needs 2*floor(beta*n) < n); "
                              f"lower beta or add clients")

    def aggregate(self, updates: Tensor, weights: Tensor | None = None) -> Tensor:
        """Mean of the middle n - 2k values per coordinate; ``weights`` are ignored."""
        _check_updates(updates, weights)
        n = updates.shape[0]
        self.validate(n)
        k = self.trimmed(n)
        if k == 0:
            return updates.mean(dim=0)
        return updates.sort(dim=0).values[k:n - k].mean(dim=0)


@dataclass(frozen=True)
class Krum:
    """Krum (m = 1) and multi-Krum (m > 1) of Blanchard et al. 2017."""

    f: int = 1
    """Number of Byzantine clients tolerated."""
    m: int = 1
    """Updates averaged: 1 = Krum, m > 1 = multi-Krum (the m lowest scores)."""
    name: str = "krum"

    def __post_init__(self) -> None:
        _check_int("krum: f", self.f, 0)
        _check_int("krum: m", self.m, 1)

    def validate(self, n: int) -> None:
        """Needs n > 2f + 2 and m <= n - f."""
        _check_int("number of clients", n, 1)
        if n <= 2 * self.f + 2:
            raise ConfigError(f"krum: f={self.f} needs more than 2f+2 = {2 * self.f + 2} clients, got {n}; "
                              f"lower f or add clients")
        if self.m > n - self.f:
            raise ConfigError(f"krum: m={self.m} exceeds n - f = {n - self.f} (multi-Krum averages honest-looking "
                              f"updates only); lower m")

    def scores(self, updates: Tensor) -> Tensor:
        """score_i [n] = sum of squared L2 distances to the n - f - 2 nearest other updates."""
        _check_updates(updates, None)
        n = updates.shape[0]
        self.validate(n)
        x = updates.detach().double()  # squared distances of near-identical updates need the digits
        # The matrix-product form of cdist cancels catastrophically for close points.
        d2 = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
        d2 = torch.nan_to_num(d2, nan=math.inf)
        d2.fill_diagonal_(math.inf)  # a point is not its own neighbour
        nearest = d2.topk(n - self.f - 2, dim=1, largest=False).values
        return nearest.sum(dim=1)

    def select(self, updates: Tensor) -> Tensor:
        """Indices [m] of the chosen updates, best first."""
        return self.scores(updates).topk(self.m, largest=False).indices

    def aggregate(self, updates: Tensor, weights: Tensor | None = None) -> Tensor:
        """The best-scoring update, or the mean of the m best; ``weights`` are ignored."""
        _check_updates(updates, weights)
        chosen = self.select(updates)
        return updates[chosen].mean(dim=0)


AGGREGATORS: dict[str, type] = {"mean": Mean, "median": CoordinateMedian, "trimmed_mean": TrimmedMean,
                                "krum": Krum}
"""Aggregator classes by configuration name."""

_PARAMS: dict[str, tuple[str, ...]] = {"mean": (), "median": (), "trimmed_mean": ("beta",), "krum": ("f", "m")}


def make_aggregator(name: str, **kw: Any) -> Aggregator:
    """The aggregator called ``name`` (``mean``, ``median``, ``trimmed_mean``, ``krum``) with
    its parameters (``beta`` for trimmed_mean; ``f``, ``m`` for krum)."""
    if name not in AGGREGATORS:
        raise ConfigError(f"unknown aggregator {name!r}; choose one of {', '.join(AGGREGATORS)}")
    unknown = sorted(set(kw) - set(_PARAMS[name]))
    if unknown:
        takes = ", ".join(_PARAMS[name]) or "no parameters"
        raise ConfigError(f"aggregator {name!r} takes {takes}; got {unknown[0]!r}")
    return AGGREGATORS[name](**kw)
