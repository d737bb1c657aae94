"""Client-level differential privacy for federated rounds (DP-FedAvg).

What is protected: **one client's entire local dataset**. Two runs that differ by adding or
removing one client (with all its nodes, edges and labels) produce output distributions
that are (epsilon, delta)-close. This is the unit of McMahan et al. 2018 ("Learning
differentially private recurrent language models"), not per-example DP.

The mechanism, per round t with participants S_t (|S_t| = n):

1. every participant clips its model update (a flat vector of d floats) to L2 norm C::

       u_i <- u_i * min(1, C / ||u_i||_2)             (:func:`clip_update`)

   so adding or removing one client changes the *sum* of updates by at most C;
2. Gaussian noise N(0, (sigma C)^2 I_d) is added to that sum (:func:`noise_for`), either

   * ``noise_at = "clients"`` (distributed DP): each participant adds N(0, (sigma C)^2 / n I_d)
     to its own clipped update before secure aggregation. The n independent shares sum to
     exactly N(0, (sigma C)^2 I_d), so the server, which only sees the securely aggregated
     sum, gets the same guarantee as in the central model; or
   * ``noise_at = "server"`` (central DP): the server adds it to the sum. This trusts the
     server with the un-noised sum.

3. the server averages (divides the noised sum by n) and applies it.

The privacy loss over T rounds is that of the sampled Gaussian mechanism with noise
multiplier sigma and sampling rate q = (participants per round) / (number of clients),
composed T times with Renyi DP (Mironov 2017; Mironov, Talwar, Zhang 2019) and converted
to (epsilon, delta) with Balle et al. 2020, Thm. 21. This is opacus's analysis, which we use
rather than re-derive: :class:`ClientDPAccountant` runs the functions behind opacus's
``RDPAccountant`` and :func:`calibrate` wraps :func:`opacus.accountants.utils.get_noise_multiplier`.
(tests/test_fed_dp.py checks opacus's numbers against the closed form for q = 1 and the
integer-order binomial sum for q < 1, both written out there.)

Caveats that the numbers rest on:

* opacus's analysis assumes Poisson sampling of clients. A trainer that picks exactly m of
  N clients per round uses q = m / N, the usual approximation (McMahan et al. 2018 do the
  same); with full participation (q = 1) it is exact.
* The server should divide the noised sum by a denominator that does not depend on the
  private data (the planned number of participants). Dividing by the realised count is
  the common approximation when participation is fixed.
* Distributed noise assumes every participant's noise share reaches the sum. If k of n
  participants drop out before their masked input arrives (clients that drop after it are
  unmasked and stay in the sum), the sum carries only (n - k)/n of the variance; the
  trainer should then add the missing (sigma C)^2 k / n at the server (``noise_for``
  with ``at = "clients"`` and ``n_participants = n / k`` draws exactly that) or account
  with the smaller sigma. The round engine does the first for the adaptive clip's count
  and stops the run for the update (fail closed).
* The noise must come from seeds nobody else knows: with the run's seed (in
  ``config.toml``) anyone can regenerate it and subtract it. The engine draws it from
  ``secrets.randbits`` seeds unless ``reproducible_noise`` asks for seeded noise (tests,
  benchmarks).
  A participant colluding with the server removes its own share from the noise as well.
* Clipping is the only bound on a client's influence: a client that does not clip (a
  Byzantine one) is not covered by DP; see :mod:`commgnn.federated.robust` for that.

Adaptive clipping (optional, ``adaptive_clip = True``) follows Andrew, Thakkar, McMahan,
Ramaswamy 2021 ("Differentially private learning with adaptive clipping"), as Flower's
``DifferentialPrivacy*AdaptiveClipping`` strategies do: each participant also reports the
bit b_i = 1[||u_i|| <= C], *centred*: it sends b_i - 1/2, so that adding or removing one
client moves the released sum by at most 1/2 (sensitivity 1/2, not 1). The server receives
sum (b_i - 1/2) + N(0, sigma_b^2), adds back n/2 (n, the number summed, is public) and moves
C geometrically toward the target quantile gamma of the update norms::

    C <- C * exp(-eta_C * (b_bar - gamma)),   b_bar = (sum (b_i - 1/2) + N(0, sigma_b^2) + n/2) / n.

Releasing the count costs privacy; the paper splits one noise multiplier z between the
two releases (the centred count's noise multiplier is sigma_b / (1/2) = 2 sigma_b): the
updates get z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2), and the accountant is charged z.
:class:`AdaptiveClip` does the bookkeeping.

Hand-written here: clipping, noise and the adaptive-clip update (a few lines each, and they
must act on flat federated updates, not on per-sample gradients as opacus's
``DPOptimizer`` does). The accounting is opacus's.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError
from commgnn.federated.config import DEFAULT_DELTA, DPConfig, NoiseAt  # noqa: F401  (their old home)

PROTECTED_UNIT = "one client's entire local dataset (client-level DP, add/remove one client)"
"""What the (epsilon, delta) of this module's guarantee protects; reported beside the numbers."""

COVERS = "every model update a client sends (clipped, noised, summed under secure aggregation)"
"""What the accountant charges for."""
NOT_COVERED = ("the per-node predictions each client sends to the server at evaluation rounds (a measurement "
               "harness: the server scores them against labels it holds; a deployment would send counts)")
"""Releases outside the guarantee, reported beside it (cross-client embeddings and the
neighbour generator's rounds are refused together with DP)."""

# ------------------------------------------------------------------ the mechanism
def clip_update(update: Tensor, clip: float) -> tuple[Tensor, float]:
    """``update`` scaled to L2 norm at most ``clip`` (any shape; the norm is over all
    entries), and its norm before clipping. An update already within the bound is returned
    as it is (the same tensor), so clipping never perturbs small updates."""
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    # float64 norm: a float32 sum of squares over millions of entries loses digits.
    norm = float(torch.linalg.vector_norm(update.detach().double()))
    if not math.isfinite(norm):
        raise ValueError("update has non-finite entries (diverged local training?); it cannot be clipped")
    if norm <= clip:
        return update, norm
    return update * (clip / norm), norm


def clip_updates(updates: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Row-wise :func:`clip_update` of ``updates`` [n, d] (a simulation of n clients):
    the clipped rows and the norms [n] before clipping (float64)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [n, d], got shape {tuple(updates.shape)}")
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    norms = torch.linalg.vector_norm(updates.detach().double(), dim=1)
    if not torch.isfinite(norms).all():
        raise ValueError("an update has non-finite entries; it cannot be clipped")
    scale = (clip / norms.clamp_min(clip)).to(updates.dtype)  # exactly 1 for rows within the bound
    return updates * scale[:, None], norms


def noise_std(sigma: float, clip: float, n_participants: int | float, at: NoiseAt) -> float:
    """Std of the noise one party adds: sigma C at the server, sigma C / sqrt(n) at each of
    n clients (n independent shares then sum to variance (sigma C)^2)."""
    if at == "server":
        return sigma * clip
    if at == "clients":
        if not n_participants > 0:
            raise ValueError(f"n_participants must be > 0, got {n_participants}")
        return sigma * clip / math.sqrt(n_participants)
    raise ValueError(f"at must be 'server' or 'clients', got {at!r}")


def noise_for(shape: Sequence[int] | torch.Size, sigma: float, clip: float, n_participants: int | float,
              generator: torch.Generator | None = None, at: NoiseAt = "clients", *,
              dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Tensor:
    """Gaussian noise of ``shape`` for one party: N(0, (sigma C)^2) at the server, or one
    client's share N(0, (sigma C)^2 / n) (:func:`noise_std`). sigma = 0 gives zeros."""
    std = noise_std(sigma, clip, n_participants, at)
    if std == 0:
        return torch.zeros(tuple(shape), dtype=dtype, device=device)
    return torch.randn(tuple(shape), generator=generator, dtype=dtype, device=device) * std


def privatise_update(update: Tensor, *, clip: float, sigma: float, n_participants: int,
                     at: NoiseAt, generator: torch.Generator | None = None) -> tuple[Tensor, float]:
    """A client's side of one round: clip ``update`` to ``clip`` and, with ``at = "clients"``,
    add its noise share. Returns the update to send (to secure aggregation) and the norm
    before clipping (for adaptive clipping and logs; it is not to be sent in the clear)."""
    clipped, norm = clip_update(update, clip)
    if at == "clients" and sigma > 0:
        clipped = clipped + noise_for(update.shape, sigma, clip, n_participants, generator, "clients",
                                      dtype=update.dtype, device=update.device)
    return clipped, norm


# ------------------------------------------------------------------ accounting
def _check_rate(sample_rate: float) -> None:
    if not (isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1):
        raise ConfigError(f"client sample rate (participants / clients) must lie in (0, 1], got {sample_rate}")


def calibrate(cfg: DPConfig, rounds: int, sample_rate: float) -> float:
    """The noise multiplier sigma for ``cfg``: ``cfg.noise_multiplier`` when set, 0 when DP is
    off, else the smallest sigma (to opacus's tolerance of 0.01 in epsilon) for which
    ``rounds`` rounds at client sampling rate ``sample_rate`` spend at most ``cfg.epsilon``
    at ``cfg.delta``. With adaptive clipping this is the *total* multiplier z; the updates
    get :meth:`AdaptiveClip.update_noise_multiplier` of it."""
    if cfg.noise_multiplier > 0:
        return float(cfg.noise_multiplier)
    if not cfg.enabled:
        return 0.0
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds must be a positive integer, got {rounds!r}")
    _check_rate(sample_rate)
    from opacus.accountants.utils import get_noise_multiplier

    try:
        sigma = get_noise_multiplier(target_epsilon=cfg.epsilon, target_delta=cfg.delta,
                                     sample_rate=float(sample_rate), steps=rounds, accountant="rdp")
    except ValueError as exc:  # opacus: "The privacy budget is too low."
        raise ConfigError(f"epsilon={cfg.epsilon} at delta={cfg.delta} cannot be met over {rounds} rounds at "
                          f"sample rate {sample_rate} ({exc}); raise epsilon or lower the rounds") from None
    return float(sigma)


class ClientDPAccountant:
    """Privacy spent so far, in client-level (epsilon, delta): opacus's RDP analysis of the
    sampled Gaussian mechanism, charged once per round with the round's noise multiplier and
    participating fraction.

    RDP composes additively, so rounds are kept as counts per distinct (noise multiplier,
    sample rate) and each distinct pair's RDP curve is computed once. (opacus's
    :class:`~opacus.accountants.RDPAccountant` merges only consecutive equal rounds and
    recomputes every curve on each query; when participation varies from round to round
    that costs seconds per query.) The numbers are identical: :meth:`as_opacus` gives the
    equivalent ``RDPAccountant``, and the tests drive both.
    """

    def __init__(self, *, delta: float = DEFAULT_DELTA, clip: float = 1.0, noise_multiplier: float = 0.0) -> None:
        fraction("delta", delta, open_low=True, open_high=True)
        self.delta = float(delta)
        """The delta at which :meth:`epsilon` and :meth:`report` state the guarantee."""
        self.clip = float(clip)
        """The clip of the latest round (reported; adaptive clipping changes it)."""
        self.noise_multiplier = float(noise_multiplier)
        """The noise multiplier of the latest round (the total z under adaptive clipping)."""
        self.sample_rate: float | None = None
        """The participating fraction of the latest round."""
        self._steps: dict[tuple[float, float], int] = {}  # (sigma, q) -> rounds, in first-seen order
        self._curves: dict[tuple[float, float], Any] = {}  # (sigma, q) -> RDP of one round at ALPHAS

    def step(self, *, sample_rate: float, noise_multiplier: float | None = None, clip: float | None = None) -> None:
        """Charge one round in which ``sample_rate`` of the clients took part (participants /
        clients) under noise multiplier ``noise_multiplier`` (default: the previous one)."""
        _check_rate(sample_rate)
        if noise_multiplier is not None:
            positive("noise_multiplier", noise_multiplier, allow_zero=True)
            self.noise_multiplier = float(noise_multiplier)
        if clip is not None:
            self.clip = float(clip)
        self.sample_rate = float(sample_rate)
        key = (self.noise_multiplier, self.sample_rate)
        self._steps[key] = self._steps.get(key, 0) + 1

    @property
    def rounds(self) -> int:
        """Rounds charged so far."""
        return sum(self._steps.values())

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(noise multiplier, sample rate, rounds) per distinct pair, opacus's layout."""
        return [(s, q, n) for (s, q), n in self._steps.items()]

    def as_opacus(self) -> Any:
        """An :class:`opacus.accountants.RDPAccountant` holding the same rounds."""
        from opacus.accountants import RDPAccountant

        acc = RDPAccountant()
        acc.history = self.history
        return acc

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far at ``delta`` (default: the accountant's); 0 before any round,
        inf when a round ran without noise."""
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as analysis

        if not self._steps:
            return 0.0
        if any(sigma == 0 for sigma, _ in self._steps):
            return math.inf  # no noise, no privacy (opacus would warn about its alpha grid)
        alphas = RDPAccountant.DEFAULT_ALPHAS
        total = 0.0
        for key, n in self._steps.items():
            if key not in self._curves:
                self._curves[key] = analysis.compute_rdp(q=key[1], noise_multiplier=key[0], steps=1, orders=alphas)
            total = total + self._curves[key] * n
        eps, _ = analysis.get_privacy_spent(orders=alphas, rdp=total, delta=self.delta if delta is None else delta)
        return float(eps)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the accounting exactly (plain values: JSON-able)."""
        return {"history": [[s, q, n] for s, q, n in self.history], "delta": self.delta, "clip": self.clip,
                "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the epsilon afterwards is the saved one's)."""
        try:
            steps: dict[tuple[float, float], int] = {}
            for s, q, n in state["history"]:
                key = (float(s), float(q))
                steps[key] = steps.get(key, 0) + int(n)
            delta, clip = float(state["delta"]), float(state["clip"])
            sigma = float(state["noise_multiplier"])
            rate = state.get("sample_rate")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"saved DP accountant state is malformed ({exc!r}); was it written by "
                              f"ClientDPAccountant.state_dict?") from None
        self.delta, self.clip, self.noise_multiplier = delta, clip, sigma
        self.sample_rate = None if rate is None else float(rate)
        self._steps = steps
        self._curves = {}

    def report(self) -> dict[str, Any]:
        """The guarantee so far, for the run report."""
        return {"epsilon": self.epsilon(), "delta": self.delta, "noise_multiplier": self.noise_multiplier,
                "clip": self.clip, "rounds": self.rounds, "sample_rate": self.sample_rate,
                "protected_unit": PROTECTED_UNIT, "covers": COVERS, "not_covered": NOT_COVERED}


# ------------------------------------------------------------------ adaptive clipping
class AdaptiveClip:
    """Andrew et al. 2021's clip-norm tracking (see the module docstring).

    Per round: each participant computes :meth:`bit` of its pre-clip norm (with the current
    ``clip``) and sends it alongside its update, with its share of the count noise
    (:meth:`count_noise`) when the noise is at the clients; the server then calls
    :meth:`update` with the (noised) sum of bits and the number of participants.
    """

    def __init__(self, cfg: DPConfig, *, n_participants: int) -> None:
        if not cfg.adaptive_clip:
            raise ConfigError("AdaptiveClip needs a DPConfig with adaptive_clip = true")
        positive("n_participants", n_participants)
        self.cfg = cfg
        self.clip = float(cfg.clip)
        """The current clip norm C."""
        self.count_stddev = cfg.count_stddev if cfg.count_stddev is not None else n_participants / 20
        """sigma_b: std of the noise on the sum of bits."""

    def update_noise_multiplier(self, total: float) -> float:
        """z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the noise multiplier left for the updates
        when the count release takes its share of the total ``total`` (the accountant is
        charged ``total``)."""
        if total == 0:
            return 0.0
        rest = total ** -2 - (2 * self.count_stddev) ** -2
        if rest <= 0:
            raise ConfigError(f"count_stddev={self.count_stddev:g} is too small for noise multiplier {total:.4g} "
                              f"(adaptive clipping needs count_stddev > {total / 2:.4g}): raise dp.count_stddev "
                              f"(--dp-count-stddev)")
        return rest ** -0.5

    def bit(self, norm: float) -> float:
        """1.0 when a pre-clip ``norm`` is within the current clip, else 0.0."""
        return 1.0 if norm <= self.clip else 0.0

    def centred_bit(self, norm: float) -> float:
        """What a participant releases: ``bit(norm) - 1/2`` (sensitivity 1/2; the server adds
        back n/2 for the n bits summed)."""
        return self.bit(norm) - 0.5

    def count_noise(self, n_participants: int, generator: torch.Generator | None = None,
                    at: NoiseAt = "clients") -> float:
        """One party's noise on the bit count: N(0, sigma_b^2) at the server, N(0, sigma_b^2 / n)
        at each of n clients."""
        std = noise_std(self.count_stddev, 1.0, n_participants, at)
        return float(torch.randn((), generator=generator, dtype=torch.float64)) * std

    def update(self, noised_count: float, n_participants: int) -> float:
        """C <- C exp(-eta_C (b_bar - gamma)) with b_bar = noised_count / n (clamped to [0, 1],
        as noise can push it outside), capped at ``cfg.clip_ceiling``; returns the new C."""
        positive("n_participants", n_participants)
        b_bar = min(max(noised_count / n_participants, 0.0), 1.0)
        self.clip = min(self.clip * math.exp(-self.cfg.clip_lr * (b_bar - self.cfg.target_quantile)),
                        self.cfg.clip_ceiling)
        return self.clip

    def state_dict(self) -> dict[str, float]:
        """The current clip and count noise (for resume)."""
        return {"clip": self.clip, "count_stddev": self.count_stddev}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.clip = float(state["clip"])
        self.count_stddev = float(state["count_stddev"])
