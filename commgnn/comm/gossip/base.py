"""Decentralised training: each rank keeps its own model and averages with neighbours
instead of all-reducing gradients (replaces the gradient sync when ``[comm.gossip]`` is set).

Per step, before the optimiser update, :meth:`sync` mixes the parameters with the round's
neighbours over point-to-point messages (``batch_isend_irecv``) and scales the local
gradient by P (each rank's loss is its share of the global loss, so the average of the P
local steps is the full-gradient step).

* :class:`DPSGD` (Lian et al., NeurIPS'17): ``x_i <- sum_j W_ij x_j`` with a doubly
  stochastic ``W`` from :class:`~commgnn.comm.gossip.topology.Topology`.
* :class:`DPSGDAdaptThenCombine`: the same mixing after the local step (diffusion order).
* :class:`PushSum` (Stochastic Gradient Push, Assran et al., ICML'19): each rank keeps
  ``(x_i, w_i)``, sends equal shares ``x_i / (d_i + 1)`` and ``w_i / (d_i + 1)`` to its
  ``d_i`` out-neighbours of the round (keeping one share) and computes with
  ``z_i = x_i / w_i``. Sums of x and w are invariant, so directed and time-varying graphs
  still converge to the average.

The strategies live in :mod:`~commgnn.comm.gossip.dpsgd`, :mod:`~commgnn.comm.gossip.pushsum`
and :mod:`~commgnn.comm.gossip.tracking`; this module holds what they share: the peer
exchange, flat models and :class:`GossipBase`.

Bytes: a copy of the parameters (in their dtype) to each out-neighbour, plus push-sum's w.
:meth:`consensus` (an all-reduce, measurement only, not counted) gives the mean distance of
the local models to their average, and the average itself for evaluation.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from commgnn.comm.gossip.topology import Topology
from commgnn.comm.grad_sync import GradSyncBase
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


def exchange_with_peers(ctx: DistContext, hooks: Hooks, t: Tensor, send_to: list[int],
                        recv_from: list[int], kind: str = "grad_sync") -> dict[int, Tensor]:
    """Send ``t`` to each of ``send_to`` and receive a same-shaped tensor from each of ``recv_from``."""
    for j in send_to:
        hooks.sent(kind, -1, j, t.numel() * t.element_size())  # type: ignore[arg-type]
    if not send_to and not recv_from:
        return {}
    with hooks.timed("comm"):
        # gloo's point-to-point reads host memory only (its collectives stage device tensors
        # themselves), so gloo ranks on a GPU send a host copy, timed as gloo's staging is
        src = t.to(ctx.comm_device)
        out = {j: torch.empty_like(src) for j in recv_from}
        ops = [dist.P2POp(dist.isend, src, j, group=ctx.group) for j in send_to]
        ops += [dist.P2POp(dist.irecv, out[j], j, group=ctx.group) for j in recv_from]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return {j: v.to(t.device) for j, v in out.items()}  # no copy where src was t


def flat_params(params: list[nn.Parameter]) -> Tensor:
    return parameters_to_vector(params).detach()  # in the parameters' dtype


def write_params(params: list[nn.Parameter], flat: Tensor) -> None:
    with torch.no_grad():
        vector_to_parameters(flat, params)


class GossipBase(GradSyncBase):
    """Shared parts of the decentralised strategies: topology, round counter, consensus."""

    decentralised = True

    def __init__(self, ctx: DistContext, hooks: Hooks, topology: str) -> None:
        self.ctx, self.hooks = ctx, hooks
        self.topology = Topology(topology, ctx.world_size)
        self.round = 0

    def mix(self, t: Tensor) -> Tensor:
        """One round of doubly stochastic averaging of ``t`` (``[n]``) with this round's peers:
        ``sum_j W_ij t_j``."""
        W = self.topology.mixing(self.round)
        send_to, recv_from = self.topology.peers(self.round, self.ctx.rank)
        got = exchange_with_peers(self.ctx, self.hooks, t, send_to, recv_from)
        mixed = float(W[self.ctx.rank, self.ctx.rank]) * t
        for j, tj in got.items():
            mixed += float(W[self.ctx.rank, j]) * tj
        return mixed

    def mix_models(self, params: list[nn.Parameter]) -> None:
        """Adapt-then-combine: replace the models by this round's mix, then start the next round."""
        if self.ctx.is_distributed:
            write_params(params, self.mix(flat_params(params)))
            self.round += 1

    def _scale_grads(self, params: list[nn.Parameter]) -> None:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(self.ctx.world_size)

    def consensus(self, params: Iterable[nn.Parameter]) -> tuple[float, Tensor]:
        """(mean over ranks of ||x_i - mean x||, mean x) — all ranks call it."""
        x = flat_params(list(params))
        mean = self.ctx.all_reduce(x.clone()) / self.ctx.world_size
        dist_i = torch.tensor([float((x - mean).norm())], dtype=torch.float64)
        return float(self.ctx.all_reduce(dist_i)) / self.ctx.world_size, mean
