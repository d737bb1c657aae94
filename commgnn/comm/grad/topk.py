"""Top-k gradient sparsification with error feedback (after Deep Gradient Compression).

Each step a rank sends the ``k = ceil(density * n)`` entries of largest magnitude of
``g + e`` as (int32 index, float32 value) pairs, ``8 k`` bytes, and keeps the rest in its
residual ``e``. DGC's other parts, each optional:

* **warm-up**: the density falls exponentially from ``warmup_density`` to ``ratio`` over the
  first ``warmup_steps`` steps (every rank follows the same schedule, so payloads agree);
* **momentum correction**: with ``momentum = m > 0`` the rank accumulates the velocity
  ``u <- m u + g`` into ``v <- v + u`` and sends the top-k of ``v``, clearing the sent
  entries of ``u`` and ``v`` (meant for a momentum-free optimiser; ``v`` is the residual);
* **local clipping**: ``clip_norm`` clips each rank's gradient to ``clip_norm / sqrt(P)``
  before it is accumulated.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from commgnn.comm.grad.compressed import CompressedSync, as_bytes, host_copy
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


class TopKSync(CompressedSync):
    def __init__(self, ctx: DistContext, hooks: Hooks, *, ratio: float, warmup_steps: int = 0,
                 warmup_density: float = 0.25, momentum: float = 0.0, clip_norm: float | None = None,
                 seed: int = 0) -> None:
        super().__init__(ctx, hooks, seed=seed)
        self.ratio, self.warmup_steps, self.warmup_density = ratio, warmup_steps, warmup_density
        self.momentum, self.clip_norm = momentum, clip_norm
        self.error_feedback = momentum == 0.0  # with momentum correction v is the residual
        self.u: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def owns_momentum(self) -> bool:
        """With momentum correction the momentum is applied here, not by the optimiser."""
        return self.momentum > 0

    def density(self) -> float:
        """This step's fraction of entries sent (the warm-up schedule, then ``ratio``)."""
        if self.step >= self.warmup_steps or self.warmup_density <= self.ratio:
            return self.ratio
        frac = self.step / self.warmup_steps
        return math.exp(math.log(self.warmup_density) * (1 - frac) + math.log(self.ratio) * frac)

    def preprocess(self, g: Tensor) -> Tensor:
        """Local clipping of the raw gradient (before it meets the residual)."""
        if self.clip_norm is not None:
            limit = self.clip_norm / math.sqrt(self.ctx.world_size)
            norm = float(g.norm())
            if norm > limit:
                g = g * (limit / norm)
        return g

    def encode(self, g: Tensor) -> Tensor:
        cand = g
        if self.momentum:
            if self.u is None:
                self.u, self.v = torch.zeros_like(g), torch.zeros_like(g)
            self.u.mul_(self.momentum).add_(g)
            self.v.add_(self.u)
            cand = self.v
        k = max(1, math.ceil(self.density() * g.numel()))
        idx = torch.topk(cand.abs(), k, sorted=False).indices
        vals = cand[idx]
        if self.momentum:
            self.u[idx] = 0
            self.v[idx] = 0
        return torch.cat([as_bytes(idx.to(torch.int32)), as_bytes(vals.to(torch.float32))])

    def decode(self, payload: Tensor, n: int) -> Tensor:
        k = payload.numel() // 8
        idx = payload[: 4 * k].clone().view(torch.int32).long()
        vals = payload[4 * k:].clone().view(torch.float32)
        out = torch.zeros(n, dtype=torch.float32)
        out[idx] = vals
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "u": None if self.u is None else self.u.clone(),
                "v": None if self.v is None else self.v.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.u, self.v = host_copy(state["u"]), host_copy(state["v"])
