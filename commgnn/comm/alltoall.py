"""Exact halo exchange: one ``all_to_all_single`` with per-peer splits per layer.

Forward (rank r, width d, element size s bytes)::

    send = h[send_index]                      # [sum(send_counts), d]
    halo = all_to_all(send, splits_out=send_counts, splits_in=recv_counts)   # [n_halo, d]

bytes sent to peer q: ``send_counts[q] * d * s``. Backward runs the same collective
with the splits swapped, sending each halo row's gradient to its owner, who adds it into
``grad_h`` at ``send_index`` (``index_add_``: a row sent to several peers gets the sum).
Bytes sent back to peer q: ``recv_counts[q] * d * s``. The layer-0 input does not
require a gradient, so autograd never runs its backward (no bytes).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.comm.halo import HaloPlan
from commgnn.dist.context import DistContext
from commgnn.dist.events import Hooks


def _all_to_all(ctx: DistContext, send: Tensor, out_rows: int, splits_out: list[int],
                splits_in: list[int]) -> Tensor:
    recv = send.new_empty((out_rows, *send.shape[1:]))
    dist.all_to_all_single(recv, send.contiguous(), output_split_sizes=splits_in,
                           input_split_sizes=splits_out, group=ctx.group)
    return recv


class _HaloFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, h: Tensor, ex: "AllToAllHalo", layer: int, kind: str) -> Tensor:  # type: ignore[override]
        fctx.ex, fctx.layer, fctx.n_own = ex, layer, h.shape[0]
        return ex._send(h[ex.plan.send_index], ex.plan.send_counts, ex.plan.recv_counts,
                        ex.plan.num_halo, kind, layer)

    @staticmethod
    def backward(fctx: Any, grad_halo: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        ex: AllToAllHalo = fctx.ex
        plan = ex.plan
        grad_send = ex._send(grad_halo.contiguous(), plan.recv_counts, plan.send_counts,
                             int(plan.send_index.numel()), "halo_bwd", fctx.layer)
        grad_h = grad_halo.new_zeros((fctx.n_own, *grad_halo.shape[1:]))
        grad_h.index_add_(0, plan.send_index, grad_send)
        return grad_h, None, None, None


class AllToAllHalo:
    """The exact exchange (CAGNET-style: only the rows a peer needs, one collective)."""

    def __init__(self, ctx: DistContext, plan: HaloPlan, hooks: Hooks) -> None:
        self.ctx, self.plan, self.hooks = ctx, plan, hooks

    def _send(self, rows: Tensor, splits_out: list[int], splits_in: list[int], out_rows: int,
              kind: str, layer: int) -> Tensor:
        width = rows.element_size()
        for dim in rows.shape[1:]:
            width *= dim
        for peer, n in enumerate(splits_out):
            self.hooks.sent(kind, layer, peer, n * width)  # type: ignore[arg-type]
        with self.hooks.timed("comm"):
            return _all_to_all(self.ctx, rows, out_rows, splits_out, splits_in)

    def exchange(self, h: Tensor, layer: int) -> Tensor:
        # Every rank must enter the collective, even one with nothing to send or receive.
        if not self.ctx.is_distributed:
            return h.new_zeros((0, *h.shape[1:]))
        # Inside an autograd Function grad mode is off, so the traffic class is decided here.
        kind = "halo_fwd" if torch.is_grad_enabled() else "halo_eval"
        return _HaloFn.apply(h, self, layer, kind)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
