"""Exact halo exchange: one all-to-all with per-peer splits per layer
(:func:`commgnn.distributed.request.all_to_all`: over gloo, rows of 256 bytes or more go
point to point, both directions of each link at once).

Forward (rank r, width d, element size s bytes)::

    send = h[send_index]                      # [sum(send_counts), d]
    halo = all_to_all(send, splits_out=send_counts, splits_in=recv_counts)   # [n_halo, d]

bytes sent to peer q: ``send_counts[q] * d * s``. Backward runs the same collective
with the splits swapped, sending each halo row's gradient to its owner, who adds it into
``grad_h`` at ``send_index`` (a row sent to several peers gets the sum). Bytes sent back
to peer q: ``recv_counts[q] * d * s``. The layer-0 input does not require a gradient, so
autograd never runs its backward (no bytes).

This is also the transport under every lever: whatever rows a lever hands to ``move``
(floats, packed ``uint8`` codes, bitmaps) are sent as they are and counted as their bytes.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from commgnn.comm.halo.exchange import RowExchange
from commgnn.comm.halo.protocol import HaloPlan
from commgnn.distributed.context import DistContext
from commgnn.distributed.request import all_to_all
from commgnn.distributed.events import Hooks


class AllToAllHalo(RowExchange):
    """The exact exchange (CAGNET-style: only the rows a peer needs, one collective)."""

    def __init__(self, ctx: DistContext, plan: HaloPlan, hooks: Hooks,
                 group: dist.ProcessGroup | None = None) -> None:
        self.ctx, self.plan, self.hooks = ctx, plan, hooks
        self.group = group if group is not None else ctx.group
        self.is_distributed = ctx.is_distributed

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        width = rows.element_size()
        for dim in rows.shape[1:]:
            width *= dim
        for peer, n in enumerate(out_counts):
            self.hooks.sent(kind, layer, peer, n * width)  # type: ignore[arg-type]
        if self.ctx.split_wait:  # the wait for the last rank to arrive, apart from the transfer
            with self.hooks.timed("wait"):
                dist.barrier(group=self.group)
        with self.hooks.timed("comm"):
            return all_to_all(self.ctx, self.group, rows, list(out_counts), list(in_counts))
