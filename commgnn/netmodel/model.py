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

with ``steps = 1`` for an all-to-all and ``2 (P - 1)`` for a ring all-reduce (whose bytes a
run records on the ring pairs ``(r, r + 1)``, so the same formula prices its volume). The
``hierarchical`` variant of an all-reduce (reduce inside each host, ring over hosts, then
broadcast) is :meth:`ClusterModel.allreduce_s`.

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
        return steps * latency + self.collective_factor * volume

    def allreduce_s(self, nbytes: float, *, hierarchical: bool = False) -> float:
        """One all-reduce of ``nbytes`` per rank: a ring over all ranks, or hierarchical
        (ring inside each host, ring over the hosts' leaders, broadcast back inside)."""
        P, R, H = self.world_size, self.ranks_per_host, self.hosts
        if not hierarchical or R == 1 or H == 1:
            link = self.inter if H > 1 else self.intra
            return 2 * (P - 1) * link.alpha_s + 2 * (P - 1) / P * nbytes * link.beta_s
        inside = 2 * (R - 1) * self.intra.alpha_s + 2 * (R - 1) / R * nbytes * self.intra.beta_s
        across = 2 * (H - 1) * self.inter.alpha_s + 2 * (H - 1) / H * nbytes * self.inter.beta_s
        return inside + across

    def predict_epoch(self, compute_s: float, pairs_per_epoch: Mapping[str, torch.Tensor],
                      calls: Mapping[str, float], overlap: Sequence[str] = ()) -> dict[str, float]:
        """``{"compute", "comm", "hidden", "epoch", <class>...}`` seconds for one epoch.

        ``pairs_per_epoch[c]``: ``[P, P]`` bytes of class c in one epoch; ``calls[c]``: how
        many collectives carry them (all-reduce classes: name them in ``calls`` with a
        negative count, ``-k`` = k ring all-reduces). ``overlap``: classes exchanged in the
        background while the epoch computes; ``hidden = min(compute, their time)`` comes
        off the epoch (``comm`` stays the full time on the wire)."""
        out = {"compute": compute_s}
        P = self.world_size
        for c, B in pairs_per_epoch.items():
            k = calls.get(c, 1.0)
            if float(B.sum()) == 0 or k == 0:
                continue
            steps = 2 * (P - 1) if k < 0 else 1
            k = abs(k)
            out[c] = k * self.collective_s(B / k, steps=steps)
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
                            collective_factor=float(d.get("collective_factor", 1.0)), fits=dict(d.get("fits", {})))

    @staticmethod
    def written(hosts: int, ranks_per_host: int, rate_bps: float, *, delay_s: float = 0.0,
                intra_rate_bps: float = 100e9, intra_alpha_s: float = 5e-6, inter_alpha_s: float = 30e-6) -> "ClusterModel":
        """A model from a written description (a NIC rate and a one-way delay), for clusters
        not at hand. ``inter_alpha_s`` defaults to a TCP round of a data-centre network."""
        return ClusterModel(hosts=hosts, ranks_per_host=ranks_per_host,
                            intra=Link(alpha_s=intra_alpha_s, beta_s=8.0 / intra_rate_bps),
                            inter=Link(alpha_s=inter_alpha_s + delay_s, beta_s=8.0 / rate_bps), source="written")


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
