"""Shared machinery of compressed gradient sync (top-k, QSGD, signSGD) with error feedback.

Each rank flattens its gradients into one vector ``g`` (``[n]``), adds its residual ``e``
(what earlier steps did not send), encodes ``g + e`` into a payload, and keeps
``e <- (g + e) - decode(payload)``: the residual accumulates exactly what was not sent.
Payloads have the same size on every rank, so one ``all_gather`` moves them; every rank
decodes all P payloads and sums them, which is the (approximate) global gradient sum the
:class:`~commgnn.comm.grad_sync.GradSync` Protocol asks for.

Bytes: an all-gather delivers each rank's payload to the P-1 others; a ring all-gather
makes each rank send ``(P-1) x payload`` bytes, which is what is counted.

Written here: no maintained library offers these compressors on torch.distributed
(techniques.md section 4).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from commgnn.comm.grad_sync import GradSyncBase, flat_grads, set_grads
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


class CompressedSync(GradSyncBase):
    """Base class: subclasses implement :meth:`encode` and :meth:`decode`."""

    error_feedback: bool = True

    def __init__(self, ctx: DistContext, hooks: Hooks, *, seed: int = 0) -> None:
        self.ctx, self.hooks = ctx, hooks
        self.residual: Tensor | None = None
        self.gen = torch.Generator().manual_seed(seed * 7919 + ctx.rank)
        self.step = 0
        self.last_sent = 0  # payload bytes of the last step (for tests and logs)

    # -- to implement -------------------------------------------------------------
    def preprocess(self, g: Tensor) -> Tensor:
        """The raw local gradient before the residual is added (e.g. clipping)."""
        return g

    def encode(self, v: Tensor) -> Tensor:
        """``[n]`` float -> ``uint8`` payload of a size that depends on n only."""
        raise NotImplementedError

    def decode(self, payload: Tensor, n: int) -> Tensor:
        """Inverse of :meth:`encode` (approximately): payload -> ``[n]`` float."""
        raise NotImplementedError

    # -- the Protocol ---------------------------------------------------------------
    def sync(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        g = self.preprocess(flat_grads(params).to(torch.float32).cpu())
        if self.error_feedback:
            if self.residual is None:
                self.residual = torch.zeros_like(g)
            g = g + self.residual
        payload = self.encode(g)
        mine = self.decode(payload, g.numel())
        if self.error_feedback:
            self.residual = g - mine
        set_grads(params, self._gather_sum(payload, mine, g.numel()))
        self.step += 1

    def _gather_sum(self, payload: Tensor, mine: Tensor, n: int) -> Tensor:
        self.last_sent = payload.numel()
        if not self.ctx.is_distributed:
            return mine
        P = self.ctx.world_size
        self.hooks.sent("grad_sync", -1, -1, (P - 1) * payload.numel())
        device_payload = payload.to(self.ctx.comm_device)
        out = [torch.empty_like(device_payload) for _ in range(P)]
        with self.hooks.timed("comm"):
            dist.all_gather(out, device_payload, group=self.ctx.group)
        total = torch.zeros(n, dtype=torch.float32)
        for r, pay in enumerate(out):
            total += mine if r == self.ctx.rank else self.decode(pay.cpu(), n)
        return total

    def state_dict(self) -> dict[str, Any]:
        return {"residual": None if self.residual is None else self.residual.clone(),
                "gen": self.gen.get_state(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # host_copy: the compressors run on the host (sync moves g to the CPU), so their state
        # lives there whatever device the trainer moved the loaded state to
        self.residual = host_copy(state["residual"])
        self.gen.set_state(state["gen"])
        self.step = state["step"]


def host_copy(t: Tensor | None) -> Tensor | None:
    """A CPU copy of a state tensor (``None`` stays ``None``): the host-side state of the
    compressors, restored from a checkpoint, whichever device it was loaded onto."""
    return None if t is None else t.to("cpu", copy=True)


def as_bytes(t: Tensor) -> Tensor:
    """The raw bytes of a contiguous tensor, as ``uint8 [nbytes]``."""
    return t.contiguous().reshape(-1).view(torch.uint8)
