"""Cyclic local top-k (CLT-k, after ScaleCom; Chen et al., NeurIPS'20): top-k sparsification
whose index set is shared, so the values can be *all-reduced* instead of all-gathered.

Plain top-k (:mod:`commgnn.comm.grad.topk`) lets every rank pick its own indices, so the sparse
payloads must be all-gathered: each rank sends ``(P-1) x 8k`` bytes, and the saving over a
ring all-reduce of ``n`` fp32 values is only ``n / (P k)`` (12.5x at 1% density on 8 ranks).
CLT-k lets one rank choose for everyone. At step ``t`` the leader ``l = t mod P``:

1. forms ``a_i = g_i + e_i`` on every rank (``g_i`` ``[n]``: this rank's gradient share,
   ``e_i`` ``[n]``: its error-feedback residual);
2. the leader picks ``I`` = the ``k = ceil(ratio * n)`` largest ``|a_l|`` and broadcasts
   ``I`` (``k`` int32) and the scalar ``s = max |a_l[I]|``;
3. every rank all-reduces (SUM) ``a_i[I] / s`` as fp16 (``half = true``) or fp32 values, and
   sets ``grad[I] = s * sum_i a_i[I] / s``, zero elsewhere;
4. ``e_i <- a_i - decode_i`` keeps exactly what rank i did not get across, rounding included.

Dividing by the leader's largest value keeps fp16 values in [-1, 1] for the leader and in
fp16's normal range for the others (a rank whose entries are 65504 times the leader's would
overflow; the residual cannot absorb an inf, so such values are clamped to +-65504 and the
excess stays in the residual).

Bytes, summed over ranks: the broadcast delivers ``4k + 4`` bytes to each of the P-1 other
ranks, and the ring all-reduce of ``k`` values of ``b`` bytes sends ``2 (P-1) k b``:
``(P-1)(4k + 4 + 2kb)``, against ``8 (P-1) n`` for fp32 all-reduce, i.e. ``n / k`` with fp16
values (100x at 1% density) and ``2n / 3k`` with fp32 values. The leader rotates, so every
rank chooses the index set once every P steps.

Measured (session 3; single runs): at ``ratio = 1`` it equals fp32 all-reduce step for step;
at lower ratios it trains worse than per-rank top-k. On the 4-rank synthetic test graph with
SGD at ``ratio = 0.05`` the loss goes 1.04 -> 2.8 in 60 steps where top-k at the same ratio
reaches 0.03. On Computers (GCN, 8 ranks, 150 epochs) ``ratio = 0.01`` with fp16 values is
99.8x smaller than fp32 all-reduce but reaches 47% (SGD) / 63% (Adam) test accuracy against
88% / 87%. On Coauthor CS (session 5, 3 seeds, SGD, the same ratio and fp16 values) it
trains but loses 4.8 (GCN) and 8.3 (GraphSAGE) points. Not implemented: ScaleCom's low-pass
filter on the residual, which its authors add for stability; that other ranks' unsent
entries wait up to P-1 steps in their residuals is a plausible cause, not an isolated one.

With ``momentum = m > 0`` the momentum moves into the compressor, as in DGC's momentum
correction: ``u_i <- m u_i + g_i``, ``e_i`` accumulates ``u_i`` instead of ``g_i``, and
the chosen entries of ``u_i`` are zeroed. The trainer's SGD then runs without its own
momentum (:attr:`owns_momentum`), so momentum is not applied twice. On the 4-rank test
graph, SGD momentum 0.9 in the optimiser made CLT-k at ratio 0.1-0.2 oscillate, while
without momentum it tracks per-rank top-k (loss 0.152 against 0.145 after 60 steps).
With momentum correction it trains there at ratio 0.1 (loss 0.057 after 60 steps). On
Computers (GCN, 8 ranks, SGD, ratio 0.01, seed 0) it still did not train: 37.8%.

Written here: no maintained library offers CLT-k on torch.distributed.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from commgnn.comm.collectives import counted_all_reduce
from commgnn.comm.grad.compressed import CompressedSync, host_copy
from commgnn.comm.grad_sync import flat_grads, set_grads
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks

_FP16_MAX = 65504.0


class CyclicTopKSync(CompressedSync):
    """CLT-k with error feedback; ``half`` sends the values in fp16."""

    def __init__(self, ctx: DistContext, hooks: Hooks, *, ratio: float, half: bool = True, momentum: float = 0.0,
                 seed: int = 0) -> None:
        super().__init__(ctx, hooks, seed=seed)
        self.ratio, self.half, self.momentum = ratio, half, momentum
        self.u: Tensor | None = None  # [n] local velocity (momentum correction)

    @property
    def owns_momentum(self) -> bool:
        """With momentum correction the momentum is applied here, not by the optimiser."""
        return self.momentum > 0

    def leader(self) -> int:
        return self.step % self.ctx.world_size

    def _choose(self, a: Tensor, k: int) -> tuple[Tensor, float]:
        """The leader's indices ``[k]`` (int64) and its scale, broadcast to every rank as
        one int32 message of ``k + 1`` words (the scale's fp32 bits last)."""
        msg = torch.zeros(k + 1, dtype=torch.int32)
        if self.ctx.rank == self.leader():
            idx = torch.topk(a.abs(), k, sorted=False).indices
            msg[:k] = idx.to(torch.int32)
            msg[k:] = a[idx].abs().max().reshape(1).view(torch.int32)
        if self.ctx.is_distributed:
            if self.ctx.rank == self.leader():
                self.hooks.sent("grad_sync", -1, -1, (self.ctx.world_size - 1) * msg.numel() * msg.element_size())
            dev = msg.to(self.ctx.comm_device)
            with self.hooks.timed("comm"):
                dist.broadcast(dev, src=self.leader(), group=self.ctx.group)
            msg = dev.cpu()
        return msg[:k].long(), float(msg[k:].view(torch.float32))

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        g = flat_grads(params).to(torch.float32).cpu()
        if self.residual is None:
            self.residual = torch.zeros_like(g)
        if self.momentum:
            # DGC's momentum correction: u <- m u + g, and the residual accumulates u
            if self.u is None:
                self.u = torch.zeros_like(g)
            self.u.mul_(self.momentum).add_(g)
            a = self.residual + self.u
        else:
            a = self.residual + g
        k = max(1, math.ceil(self.ratio * a.numel()))
        idx, scale = self._choose(a, k)
        scale = scale or 1.0
        vals = a[idx] / scale
        if self.half:
            vals = vals.clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16)
        mine = torch.zeros_like(a)
        mine[idx] = vals.to(torch.float32) * scale
        self.residual = a - mine
        if self.momentum:
            assert self.u is not None
            self.u[idx] = 0  # momentum factor masking: sent entries restart their velocity
        self.last_sent = k * vals.element_size()
        total = counted_all_reduce(self.ctx, self.hooks, vals.to(self.ctx.comm_device), "grad_sync")
        out = torch.zeros_like(a)
        out[idx] = total.cpu().to(torch.float32) * scale
        set_grads(params, out)
        self.step += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "u": None if self.u is None else self.u.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.u = host_copy(state["u"])
