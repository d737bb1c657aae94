"""The machinery every halo strategy shares: rows in send order, moved by ``move``.

A strategy implements one primitive::

    move(rows, out_counts, in_counts, layer, kind) -> received rows

``rows`` are grouped by destination rank (``out_counts[q]`` rows for rank q) and the result
is grouped by source rank (``in_counts[q]`` rows from rank q). The forward exchange moves
``h[send_index]`` with the plan's counts (``kind`` = ``halo_fwd``); the backward moves the
halo gradients the other way (``kind`` = ``halo_bwd``) and the owner sums them into
``grad_h`` at ``send_index``. :class:`RowExchange` turns ``move`` into the differentiable
``exchange(h, layer)`` of the :class:`~commgnn.comm.halo.protocol.HaloExchange` Protocol.

Levers wrap another strategy and call ``self.inner.move`` on what they decide to send
(:class:`Wrapper`), so ``Quantized(Sampled(AllToAllHalo(...)))`` composes: sampling picks
rows, quantization encodes them, the all-to-all moves the bytes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from commgnn.comm.halo.protocol import HaloPlan


class _ExchangeFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, h: Tensor, ex: "RowExchange", layer: int, kind: str) -> Tensor:  # type: ignore[override]
        fctx.ex, fctx.layer, fctx.n_own = ex, layer, h.shape[0]
        plan = ex.plan
        return ex.move(h[plan.send_index], plan.send_counts, plan.recv_counts, layer, kind)

    @staticmethod
    def backward(fctx: Any, grad_halo: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        ex: RowExchange = fctx.ex
        plan = ex.plan
        grad_send = ex.move(grad_halo.contiguous(), plan.recv_counts, plan.send_counts, fctx.layer, "halo_bwd")
        grad_h = grad_halo.new_zeros((fctx.n_own, *grad_halo.shape[1:]))
        grad_h.index_add_(0, plan.send_index, grad_send.to(grad_h.dtype))
        return grad_h, None, None, None


class RowExchange:
    """Base of every halo strategy: ``exchange`` from ``move``, plus epoch hooks and state."""

    plan: HaloPlan
    is_distributed: bool

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        raise NotImplementedError

    def exchange(self, h: Tensor, layer: int, kind: str | None = None) -> Tensor:
        """``[n_own, d] -> [n_halo, d]``, differentiable (see the module docstring).

        ``kind`` defaults to ``halo_fwd`` under autograd and ``halo_eval`` without."""
        if not self.is_distributed:  # world size 1: no halo, no collective
            return h.new_zeros((0, *h.shape[1:]))
        # Inside an autograd Function grad mode is off, so the traffic class is decided here.
        if kind is None:
            kind = "halo_fwd" if torch.is_grad_enabled() else "halo_eval"
        return _ExchangeFn.apply(h, self, layer, kind)

    def set_epoch(self, epoch: int, exact: bool) -> None:
        """Called by the trainer before each training epoch; ``exact`` asks for an exact
        exchange this epoch (a guard refresh), which levers honour by passing through."""

    def flush(self) -> None:
        """Called after the backward pass: finish anything still in flight."""

    def epoch_log(self) -> dict[str, Any]:
        """Per-epoch facts worth logging (e.g. chosen bit-widths)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Wrapper(RowExchange):
    """A lever around another strategy; by default every call passes through to it."""

    def __init__(self, inner: RowExchange) -> None:
        self.inner = inner
        self.plan = inner.plan
        self.is_distributed = inner.is_distributed
        self.epoch, self.exact_now = 0, False

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        return self.inner.move(rows, out_counts, in_counts, layer, kind)

    @property
    def transport(self) -> RowExchange:
        """The innermost strategy (the one that really sends)."""
        inner = self.inner
        return inner.transport if isinstance(inner, Wrapper) else inner

    def set_epoch(self, epoch: int, exact: bool) -> None:
        """Remember the epoch and whether it is a guard epoch (``exact_now``: step aside)."""
        self.epoch, self.exact_now = epoch, exact
        self.inner.set_epoch(epoch, exact)

    def flush(self) -> None:
        self.inner.flush()

    def epoch_log(self) -> dict[str, Any]:
        return self.inner.epoch_log()

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), **self.own_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.load_own_state({k: v for k, v in state.items() if k != "inner"})

    def own_state(self) -> dict[str, Any]:
        return {}

    def load_own_state(self, state: dict[str, Any]) -> None:
        pass
