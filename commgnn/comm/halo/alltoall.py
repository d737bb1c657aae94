"""Exact halo exchange: one ``all_to_all_single`` with per-peer splits per layer.

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
        recv = rows.new_empty((sum(in_counts), *rows.shape[1:]))
        with self.hooks.timed("comm"):
            dist.all_to_all_single(recv, rows.contiguous(), output_split_sizes=list(in_counts),
                                   input_split_sizes=list(out_counts), group=self.group)
        return recv
