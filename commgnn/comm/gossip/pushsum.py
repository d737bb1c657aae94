"""Push-sum gossip (Stochastic Gradient Push, Assran et al., ICML'19).

Each rank keeps ``(x_i, w_i)``, sends equal shares ``x_i / (d_i + 1)`` and
``w_i / (d_i + 1)`` to its ``d_i`` out-neighbours of the round (keeping one share) and
computes with ``z_i = x_i / w_i``. Sums of x and w are invariant, so directed and
time-varying graphs still converge to the average.

Bytes: a copy of the parameters (in their dtype) plus the weight ``w`` to each
out-neighbour of the round.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from commgnn.comm.gossip.base import GossipBase, exchange_with_peers, flat_params, write_params
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


class PushSum(GossipBase):
    def __init__(self, ctx: DistContext, hooks: Hooks, topology: str) -> None:
        super().__init__(ctx, hooks, topology)
        self.weight = 1.0

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        self._scale_grads(params)
        if not self.ctx.is_distributed:
            return
        send_to, recv_from = self.topology.peers(self.round, self.ctx.rank)
        share = 1.0 / (len(send_to) + 1)
        # what travels is (x, w) with x = z * w, both scaled by the share
        x = flat_params(params)
        msg = torch.cat([x * self.weight, torch.tensor([self.weight], dtype=x.dtype, device=x.device)]) * share
        got = exchange_with_peers(self.ctx, self.hooks, msg, send_to, recv_from)
        total = msg.clone()
        for m in got.values():
            total += m
        self.weight = float(total[-1])
        write_params(params, total[:-1] / self.weight)
        self.round += 1

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "weight": self.weight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round, self.weight = state["round"], state["weight"]
