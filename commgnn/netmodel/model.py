"""An alpha-beta cost model of a cluster's links, and the epoch time it predicts for a run.

Written by hand (the Hockney model; no maintained library fits it to torch.distributed).

Links come in classes: ``intra`` (two ranks on one host) and ``inter`` (different hosts).
A message of ``n`` bytes over a link of class ``c`` takes ``alpha_c + n * beta_c`` seconds.
Hosts are ``ranks_per_host`` consecutive ranks (torchrun's numbering), and all the ranks of
a host share its one network port, full duplex. One collective of a traffic class moves
the byte matrix ``B[s, r]`` (sender s, receiver r; ``bytes_by_pair`` of a run, per call);
it takes

    T(B) = steps * alpha_inter + max( max_h out_h(B) * beta_inter,      out_h: bytes leaving host h
                                       max_h in_h(B)  * beta_inter,      in_h:  bytes entering host h
                                       max_s intra_s(B) * beta_intra )   intra_s: s's bytes within its host

with ``steps = 1`` for an all-to-all. A calibrated model prices an all-to-all on the
calibration's measured curve instead: the links' price of its bytes (the formula with
factor 1) interpolated piecewise-linearly between the calibrated sizes' (price, measured)
points (``a2a_points``), extended past the largest by the last segment's slope and below
the smallest by that size's excess over its price (when positive). A single factor fitted
at the largest size cannot follow that curve: it over-prices mid-size exchanges and
under-prices small ones (the docs' cost-model pages give the measurements). An all-reduce of ``n`` bytes per rank (a run records
its bytes on the ring pairs ``(r, r + 1)``: ``2 (P - 1) / P * n`` per rank) is priced by
:meth:`ClusterModel.allreduce_s`: on a calibrated model by the backend's measured
all-reduce, ``alpha_ar + n * beta_ar`` (``allreduce``, fitted by ``commgnn calibrate``);
otherwise as a ring over the links, ``2 (P - 1)`` latencies plus its volume by the formula
above. The ``control`` class (the trainer's all-reduce of a loss and three accuracy
counts) costs the calibrated ``scalar_allreduce_s`` each. A barrier costs the calibrated
``barrier_s``, else one empty all-reduce. The ``hierarchical`` variant (reduce inside each
host, ring over hosts, then broadcast) is always priced from the links.

Why measure the all-reduce rather than count its ring steps: the backend need not run
the textbook ring, and a small all-reduce, a scalar one and a barrier each cost what the
backend makes them cost, not ``2 (P - 1)`` latencies (:mod:`commgnn.netmodel.calibrate`
measures them; the docs' cost-model design page gives figures).

An epoch is predicted as the busiest rank's measured compute plus the model's time for
each class's collectives, called ``calls[c]`` times with ``B_c / calls[c]`` bytes each.
Classes that run in the background (a pipelined halo exchange, after PipeGCN) hide behind
compute: ``epoch = compute + T_rest + max(0, T_overlapped - compute)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import torch


@dataclass(frozen=True, kw_only=True)
class Link:
    """One link class: ``alpha_s`` latency per message, ``beta_s`` seconds per byte."""

    alpha_s: float
    beta_s: float

    def time(self, nbytes: float, messages: float = 1.0) -> float:
        return messages * self.alpha_s + nbytes * self.beta_s

    @property
    def rate_bps(self) -> float:
        return 8.0 / self.beta_s if self.beta_s > 0 else float("inf")


@dataclass(frozen=True, kw_only=True)
class ClusterModel:
    """``hosts`` x ``ranks_per_host`` ranks with an ``intra`` and an ``inter`` link class."""

    hosts: int
    ranks_per_host: int
    intra: Link
    inter: Link
    source: str = ""
    """Where the numbers come from (a calibration run, or ``written``)."""
    collective_factor: float = 1.0
    """Measured all-to-all time over the ping-pong links' prediction of its volume term
    (calibrated; 1 = the links alone explain it). Many flows through one shaped port, and
    the collective's own scheduling, make it differ from 1."""
    a2a_points: tuple[tuple[float, float], ...] = ()
    """(links' price, measured) seconds of the calibration's all-to-alls, by size (see the
    module docstring); empty: priced with ``collective_factor``."""
    allreduce: Link | None = None
    """One all-reduce as the backend runs it on this cluster: ``alpha_s + n * beta_s`` for
    ``n`` bytes per rank (calibrated). None: priced as a ring over the links."""
    scalar_allreduce_s: float | None = None
    """Seconds of one all-reduce of a few scalars (4 float64; calibrated): the ``control``
    class. None: priced by :meth:`allreduce_s`."""
    barrier_s: float | None = None
    """Seconds of one barrier (calibrated). None: priced as an empty all-reduce."""
    fits: dict[str, Any] = field(default_factory=dict)
    """The calibration's points and residuals (for the record)."""

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def collective_s(self, pairs: torch.Tensor, steps: float = 1.0) -> float:
        """Seconds for one collective moving ``pairs[s, r]`` bytes (see the module docstring)."""
        B = pairs.to(torch.float64)
        P = B.shape[0]
        host = torch.arange(P) // self.ranks_per_host
        same = host[:, None] == host[None, :]
        cross = torch.where(same, torch.zeros_like(B), B)
        H = int(host.max()) + 1
        out_h = torch.zeros(H, dtype=torch.float64).index_add_(0, host, cross.sum(1))
        in_h = torch.zeros(H, dtype=torch.float64).index_add_(0, host, cross.sum(0))
        intra = torch.where(same, B, torch.zeros_like(B)).sum(1)
        volume = max(float(out_h.max()) * self.inter.beta_s, float(in_h.max()) * self.inter.beta_s,
                     float(intra.max()) * self.intra.beta_s)
        latency = self.inter.alpha_s if self.hosts > 1 else self.intra.alpha_s
        if steps == 1 and self.a2a_points:
            return on_curve(latency + volume, self.a2a_points)
        return steps * latency + self.collective_factor * volume

    def allreduce_s(self, nbytes: float, *, hierarchical: bool = False) -> float:
        """One all-reduce of ``nbytes`` per rank: the calibrated all-reduce when the model
        has one, else a ring over all ranks; or hierarchical (ring inside each host, ring
        over the hosts' leaders, broadcast back inside), from the links."""
        P, R, H = self.world_size, self.ranks_per_host, self.hosts
        if not hierarchical and self.allreduce is not None:
            return self.allreduce.time(nbytes)
        if not hierarchical or R == 1 or H == 1:
            link = self.inter if H > 1 else self.intra
            return 2 * (P - 1) * link.alpha_s + 2 * (P - 1) / P * nbytes * link.beta_s
        inside = 2 * (R - 1) * self.intra.alpha_s + 2 * (R - 1) / R * nbytes * self.intra.beta_s
        across = 2 * (H - 1) * self.inter.alpha_s + 2 * (H - 1) / H * nbytes * self.inter.beta_s
        return inside + across

    def barrier_time(self) -> float:
        """Seconds of one barrier: calibrated, else an empty all-reduce's."""
        return self.barrier_s if self.barrier_s is not None else self.allreduce_s(0.0)

    def _allreduces_s(self, ring_pairs: torch.Tensor, k: float) -> float:
        """``k`` all-reduces that together put ``ring_pairs`` on the ring pairs (the busiest
        rank's bytes are ``2 (P - 1) / P`` of the per-rank payload)."""
        P = self.world_size
        if self.allreduce is None or P < 2:
            return k * self.collective_s(ring_pairs / k, steps=2 * (P - 1))
        per_rank = float(ring_pairs.to(torch.float64).sum(1).max()) * P / (2 * (P - 1))
        return k * self.allreduce.time(per_rank / k)  # linear: how the bytes split among calls is moot

    def predict_epoch(self, compute_s: float, pairs_per_epoch: Mapping[str, torch.Tensor],
                      calls: Mapping[str, float], overlap: Sequence[str] = (), *,
                      barriers: float = 0.0) -> dict[str, float]:
        """``{"compute", "comm", "hidden", "epoch", <class>...}`` seconds for one epoch.

        ``pairs_per_epoch[c]``: ``[P, P]`` bytes of class c in one epoch; ``calls[c]``: how
        many collectives carry them (all-reduce classes: name them in ``calls`` with a
        negative count, ``-k`` = k all-reduces, :meth:`allreduce_s`; ``control``'s at
        ``scalar_allreduce_s`` when calibrated). ``barriers``: barriers
        an epoch (priced as ``barrier``). ``overlap``: classes exchanged in the background
        while the epoch computes; ``hidden = min(compute, their time)`` comes off the epoch
        (``comm`` stays the full time on the wire)."""
        out = {"compute": compute_s}
        for c, B in pairs_per_epoch.items():
            k = calls.get(c, 1.0)
            if float(B.sum()) == 0 or k == 0:
                continue
            if k < 0 and c == "control" and self.scalar_allreduce_s is not None:
                out[c] = -k * self.scalar_allreduce_s
            else:
                out[c] = self._allreduces_s(B, -k) if k < 0 else k * self.collective_s(B / k)
        if barriers and self.world_size > 1:
            out["barrier"] = barriers * self.barrier_time()
        out["comm"] = sum(v for c, v in out.items() if c != "compute")
        out["hidden"] = min(compute_s, sum(out.get(c, 0.0) for c in overlap))
        out["epoch"] = compute_s + out["comm"] - out["hidden"]
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "ClusterModel":
        return ClusterModel(hosts=int(d["hosts"]), ranks_per_host=int(d["ranks_per_host"]),
                            intra=Link(**d["intra"]), inter=Link(**d["inter"]), source=str(d.get("source", "")),
                            collective_factor=float(d.get("collective_factor", 1.0)),
                            a2a_points=_points(d),
                            allreduce=Link(**d["allreduce"]) if d.get("allreduce") else None,
                            scalar_allreduce_s=_opt_float(d.get("scalar_allreduce_s")),
                            barrier_s=_opt_float(d.get("barrier_s")),
                            fits=dict(d.get("fits", {})))

    @staticmethod
    def written(hosts: int, ranks_per_host: int, rate_bps: float, *, delay_s: float = 0.0,
                intra_rate_bps: float = 100e9, intra_alpha_s: float = 5e-6, inter_alpha_s: float = 30e-6) -> "ClusterModel":
        """A model from a written description (a NIC rate and a one-way delay), for clusters
        not at hand. ``inter_alpha_s`` defaults to a TCP round of a data-centre network."""
        return ClusterModel(hosts=hosts, ranks_per_host=ranks_per_host,
                            intra=Link(alpha_s=intra_alpha_s, beta_s=8.0 / intra_rate_bps),
                            inter=Link(alpha_s=inter_alpha_s + delay_s, beta_s=8.0 / rate_bps), source="written")


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _points(d: Mapping[str, Any]) -> tuple[tuple[float, float], ...]:
    """A model file's all-to-all curve: its own, or the one its calibration record holds
    (files written before the curve was kept)."""
    if "a2a_points" in d:
        return tuple((float(x), float(y)) for x, y in d["a2a_points"])
    a2a = d.get("fits", {}).get("all_to_all", {})
    if d.get("source") == "calibrated" and "links_only_s" in a2a and "measured_s" in a2a:
        return tuple(sorted(zip(map(float, a2a["links_only_s"]), map(float, a2a["measured_s"]))))
    return ()


def on_curve(price_s: float, points: Sequence[tuple[float, float]]) -> float:
    """Measured seconds for a links' price of ``price_s``, interpolated on ``points`` (sorted
    (price, measured) pairs): linear between points, the last segment's slope past the
    largest, and below the smallest its excess over its price when positive (software
    cost the bytes do not explain), else the price itself."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    if price_s <= xs[0]:
        return price_s + max(ys[0] - xs[0], 0.0)
    if len(xs) == 1:  # one point: its ratio
        return ys[0] * price_s / xs[0]
    i = next((k for k in range(1, len(xs)) if price_s <= xs[k]), len(xs) - 1)
    return ys[i - 1] + (price_s - xs[i - 1]) * (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])


def fit_link(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[Link, float]:
    """``t = alpha + n * beta`` through ``(sizes, seconds)``: ``beta`` the slope between the
    two largest sizes (where bytes dominate, and where a shaper's token bucket no longer
    lends a burst), ``alpha`` the smallest size's time less its bytes; the link and the
    largest relative residual over all sizes."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    n = torch.tensor([float(sizes[i]) for i in order], dtype=torch.float64)
    t = torch.tensor([float(seconds[i]) for i in order], dtype=torch.float64)
    if len(n) < 2:
        raise ValueError("a link fit needs at least two sizes")
    beta = max(float((t[-1] - t[-2]) / (n[-1] - n[-2])), 1e-15)
    alpha = max(float(t[0] - n[0] * beta), 0.0)
    pred = alpha + n * beta
    return Link(alpha_s=alpha, beta_s=beta), float(((pred - t).abs() / t).max())
