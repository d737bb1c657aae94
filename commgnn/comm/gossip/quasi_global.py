"""Quasi-global momentum for decentralised training (QG-DSGDm; Lin et al., ICML'21).

With plain D-PSGD every rank runs heavy-ball momentum on its *own* gradient. On partitions
whose losses differ, each rank's buffer accumulates its own direction, about ``1/(1-beta)``
times over, and mixing the models does nothing to the buffers. A periodic exact average
of the models (:mod:`commgnn.comm.gossip.global_average`) did not close D-PSGD's gap on Computers
(single seed: 84.6 / 85.0 at every 4 / 8 rounds against 85.1 without). QG-DSGDm builds
the buffer from the model's actual displacement, which includes the pull of the gossip
step, so every buffer tends to the global direction::

    d_i^t     = g_i^t + beta m_i^{t-1}                  (the step direction; the optimiser
    x_i^{t+1} = sum_j W_ij x_j^t - lr d_i^t              runs plain SGD on d)
    m_i^t     = beta m_i^{t-1} + (1 - beta) (x_i^t - x_i^{t+1}) / lr

``g_i`` is the wrapped gossip's local gradient (scaled by P). Wraps any gossip strategy;
it sends nothing itself, so the bytes are the wrapped strategy's. The trainer gives the
current learning rate through :meth:`set_lr` and runs SGD without momentum of its own
(:attr:`owns_momentum`).

Measured (Computers, GCN, 8 ranks, SGD lr 0.1, beta 0.9, seed 0): the models agree more
(consensus distance 0.12 at epoch 130, against D-PSGD's 0.30), but the averaged model
reaches 79.5, against 85.1 for D-PSGD and 88.0 for all-reduce. Closer local models did
not give a better average there. Over 3 seeds (150 epochs,
results/*-grad-sync-sgd-computers.md): 81.09 ± 1.21, against D-PSGD's 85.45 ± 0.31 and
all-reduce's 87.68 ± 0.61.

Written here: torch ships no decentralised optimiser (techniques.md section 5).
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import Tensor, nn

from commgnn.comm.gossip.base import GossipBase, flat_params
from commgnn.comm.gossip.global_average import PeriodicGlobalAverage
from commgnn.comm.grad_sync import GradSyncBase, flat_grads, set_grads


class QuasiGlobalMomentum(GradSyncBase):
    """``inner`` gossip with a quasi-global heavy-ball buffer of factor ``beta``."""

    decentralised = True
    owns_momentum = True

    def __init__(self, inner: GossipBase | PeriodicGlobalAverage, *, beta: float) -> None:
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta must lie in (0, 1), got {beta}")
        self.inner, self.beta = inner, beta
        self.lr: float | None = None
        self.m: Tensor | None = None         # [|theta|] quasi-global momentum buffer
        self._x_before: Tensor | None = None  # [|theta|] this rank's model before the round

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        self._x_before = flat_params(params)  # a new vector, not a view
        self.inner.sync(params)  # mixes the models, leaves the local gradient in .grad
        g = flat_grads(params)
        if self.m is not None:
            g = g + self.beta * self.m.to(g.dtype)
        set_grads(params, g)

    def after_step(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        self.inner.after_step(params)
        if self.lr is None or self._x_before is None:
            raise RuntimeError("QuasiGlobalMomentum needs set_lr() and sync() before after_step()")
        moved = (self._x_before - flat_params(params)) / self.lr
        self.m = moved if self.m is None else self.beta * self.m + (1 - self.beta) * moved

    def consensus(self, params: Iterable[nn.Parameter]) -> tuple[float, Tensor]:
        return self.inner.consensus(params)

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "m": None if self.m is None else self.m.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.m = None if state["m"] is None else state["m"].clone()
