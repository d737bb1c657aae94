"""Baseline gradient sync: one fp32 all-reduce (SUM) of all gradients flattened into a bucket.

Bytes: the ring all-reduce's payload, ``2 (P-1)/P * n * 4`` per rank for ``n`` gradient
entries, as :mod:`commgnn.comm.collectives` counts it.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from commgnn.comm.collectives import counted_all_reduce
from commgnn.comm.grad_sync import GradSyncBase, flat_grads, set_grads
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


class AllReduceSync(GradSyncBase):
    """fp32 SUM all-reduce of one flattened bucket (exact)."""

    def __init__(self, ctx: DistContext, hooks: Hooks) -> None:
        self.ctx, self.hooks = ctx, hooks

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        if not self.ctx.is_distributed:
            return
        params = [p for p in params if p.requires_grad]
        set_grads(params, counted_all_reduce(self.ctx, self.hooks, flat_grads(params), "grad_sync"))
