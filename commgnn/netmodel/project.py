"""Project a full-graph GCN/SAGE epoch onto clusters not at hand (more hosts, other links).

A projection, not a measurement: it partitions the graph into ``P = hosts x ranks_per_host``
parts (METIS), counts the halo rows every pair exchanges (:func:`commgnn.partition.placement.pair_volume`),
and prices an epoch's traffic on a written :class:`ClusterModel`:

* ``halo_fwd``: layer l sends ``V[p, q]`` rows of its input width (the features for l = 0,
  ``min(F, h)`` with ``transform_first``, none with ``precompute``; ``hidden`` after) at
  ``bits`` per value (quantized rows carry the codec's header); ``halo_bwd``: the
  gradients of layers 1..L-1 go back, ``V^T``; ``halo_eval``: one fp32 pass per epoch at
  the same widths;
* ``grad_sync``: one all-reduce of the parameters (fp32), ``control``: one tiny one, and
  one barrier (as :mod:`commgnn.netmodel.predict` prices a full-graph run);
* compute: measured ``compute_ref_s`` (one rank's forward and backward alone, e.g. a run's
  ``compute_alone_s``) at ``P_ref`` ranks, scaled by the busiest rank's work
  ``n_r (F + (L-1) h) h + e_r h L`` (dense transforms plus aggregation) at P over that at
  ``P_ref``: each host has its own cores, and a rank's compute shrinks with its share.

Written by hand on top of the cost model; no library projects GNN training traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.netmodel.model import ClusterModel
from commgnn.partition.placement import pair_volume


@dataclass(frozen=True, kw_only=True)
class Levers:
    """The traffic-shaping levers a projection prices."""

    name: str = "exact"
    bits: int = 32
    """Bits per halo value in training (32 = fp32 rows)."""
    precompute: bool = False
    """The first layer's aggregation precomputed once: no layer-0 exchange per epoch (in
    training and evaluation)."""
    transform_first: bool = False
    """Layer 0 exchanges its transformed rows, ``min(F, h)`` wide (training and evaluation)."""
    grad_ratio: float = 1.0
    """Gradient bytes relative to fp32 all-reduce (e.g. PowerSGD's compression)."""


def _row_bytes(width: int, bits: int) -> int:
    return 4 * width if bits == 32 else quant.bytes_per_row(width, bits)


def work(edge_index: Tensor, parts: Tensor, P: int, F: int, h: int, L: int) -> Tensor:
    """``[P]`` the model's work per rank (multiply-adds): dense transforms and aggregation."""
    nodes = torch.bincount(parts, minlength=P).double()
    edges = torch.bincount(parts[edge_index[1]], minlength=P).double()
    return nodes * (F + (L - 1) * h) * h + edges * h * L


def epoch_traffic(V: Tensor, *, F: int, h: int, L: int, params: int, levers: Levers) -> dict[str, Tensor]:
    """``[P, P]`` bytes per class for one epoch (see the module docstring)."""
    Vd = V.double()
    P = V.shape[0]
    widths = [min(F, h) if levers.transform_first else F] + [h] * (L - 1)
    first = 1 if levers.precompute else 0  # precompute: layer 0 never exchanges
    fwd = sum(Vd * _row_bytes(w, levers.bits) for w in widths[first:])
    bwd = sum(Vd.T * _row_bytes(w, levers.bits) for w in widths[1:]) if L > 1 else torch.zeros_like(Vd)
    ev = sum(Vd * 4 * w for w in widths[first:])
    ring = torch.zeros(P, P, dtype=torch.float64)
    ring[torch.arange(P), (torch.arange(P) + 1) % P] = 1.0
    grad = ring * 2 * (P - 1) / P * params * 4 * levers.grad_ratio
    control = ring * 2 * (P - 1) / P * 8 * 4
    return {"halo_fwd": fwd, "halo_bwd": bwd, "halo_eval": ev, "grad_sync": grad, "control": control}


def project_epoch(edge_index: Tensor, num_nodes: int, model: ClusterModel, *, F: int, h: int, L: int, C: int,
                  levers: Levers, compute_ref_s: float, work_ref: float, parts: Tensor) -> dict[str, Any]:
    """Predicted seconds per epoch of ``levers`` on ``model``'s cluster (``parts`` has
    ``model.world_size`` parts); ``work_ref``: the busiest rank's :func:`work` where
    ``compute_ref_s`` was measured."""
    P = model.world_size
    V = pair_volume(edge_index, parts, P)
    params = F * h + (L - 2) * h * h + h * C + (L - 1) * h + C
    traffic = epoch_traffic(V, F=F, h=h, L=L, params=params, levers=levers)
    calls = {"halo_fwd": L - (1 if levers.precompute else 0), "halo_bwd": L - 1,
             "halo_eval": L - (1 if levers.precompute else 0),
             "grad_sync": -1, "control": -1}
    compute = compute_ref_s * float(work(edge_index, parts, P, F, h, L).max()) / work_ref
    pred = model.predict_epoch(compute, traffic, calls, barriers=1)
    pred["bytes"] = float(sum(float(B.sum()) for B in traffic.values()))
    return pred
