"""Decentralised training with gradient tracking (DIGing / GT-DSGD; Nedić et al. 2017,
Pu & Nedić 2020), for partitions whose local losses differ a lot.

D-PSGD (:class:`~commgnn.comm.gossip.dpsgd.DPSGD`) steps each model along its *own* gradient.
With METIS partitions the local losses are far apart (label mixes differ per part), so the
local models drift towards their own optima and only the mixing pulls them back. Gradient
tracking gives every rank an estimate ``y_i`` of the *average* gradient instead::

    y_i^t     = sum_j W_ij y_j^{t-1} + g_i^t - g_i^{t-1}      (y_i^0 = g_i^0)
    x_i^{t+1} = sum_j W_ij x_j^t - step(y_i^t)                (the optimiser, fed y_i^t)

Because ``W`` is doubly stochastic, ``mean_i y_i^t = mean_i g_i^t`` at every step (tested),
so the ranks follow the global gradient even when their own ones disagree.

Bytes: ``x`` and ``y`` travel together, one message of ``2 |theta|`` values to each
out-neighbour of the round (twice D-PSGD's). Gradients are scaled by P as in D-PSGD (a
rank's loss is its share of the global loss).

Measured (session 3, 4-rank synthetic test graph, SGD lr 0.3, 60 steps): without dropout the
trackers pull the models together (consensus distance 0.01 against D-PSGD's 0.22, at a
similar loss); with dropout 0.5 the loss is noisier than D-PSGD's (0.16-0.62 against
0.09-0.23 over the last 30 steps). On Computers (GCN, 8 METIS ranks, 150 epochs, SGD
momentum 0.9) it does not train: 46% test accuracy over 3 seeds at lr 0.1 against D-PSGD's
85%; in seed 0 its consensus distance stays at 0.7-1.8 against D-PSGD's 0.3-0.8. Dropout
noise is not the cause: single-seed probes (session 4) reach 43% with dropout 0 and 51% at
lr 0.05, where D-PSGD reaches 83% and fp32 all-reduce 88% (dropout 0). A plausible
mechanism, not isolated: each ``g_i^t - g_i^{t-1}`` also carries the jump that mixing gave
``x_i``, and the halo exchange couples every rank's gradient to its neighbours' models, so a
large consensus distance can feed itself.

:class:`AdaptThenCombineTracking` mixes after the local change instead. On a label-skewed
synthetic graph (CSBM, 4000 nodes, 8 classes, homophily 0.9, 8 METIS ranks: about one class
per rank; GCN, SGD momentum 0.9, 100 epochs, seed 0) it closes most of D-PSGD's gap:

| lr | fp32 all-reduce | D-PSGD | tracking | tracking-atc |
|---|---|---|---|---|
| 0.1 | 99.2 | 75.2 | 69.0 | 95.6 |
| 0.05 | 98.8 | 78.2 | — | 99.2 |

On Computers it does not train either (150 epochs, seed 0: 51.5% at lr 0.1, 48.5% with
dropout 0, 72.3% at lr 0.03).

On Coauthor CS the CTA form trains (session 5, 150 epochs, SGD lr 0.1, 3 seeds): 0.11
(GCN) and 0.35 (GraphSAGE) points below fp32 all-reduce, where D-PSGD is at −0.21 / +0.30.

Written here: torch ships no decentralised optimiser (techniques.md section 5).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor, nn

from commgnn.comm.gossip.base import GossipBase, flat_params, write_params
from commgnn.comm.grad_sync import flat_grads, set_grads


class GradientTracking(GossipBase):
    """Gossip of models plus a tracker of the average gradient."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.y: Tensor | None = None       # [|theta|] tracker of the average gradient
        self.g_prev: Tensor | None = None  # [|theta|] last local gradient

    def _local_grad(self, params: list[nn.Parameter]) -> Tensor | None:
        """This rank's gradient ``[|theta|]``, scaled by P; None without peers."""
        self._scale_grads(params)
        return flat_grads(params).detach() if self.ctx.is_distributed else None

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        g = self._local_grad(params)
        if g is None:
            return
        x = flat_params(params)
        n = x.numel()
        if self.y is None:
            y = g.clone()
            # round 0: only the models are mixed, the tracker starts at the local gradient
            mixed_x = self.mix(x)
        else:
            assert self.g_prev is not None
            mixed = self.mix(torch.cat([x, self.y.to(x.dtype)]))
            mixed_x, y = mixed[:n], mixed[n:].to(g.dtype) + g - self.g_prev
        self.y, self.g_prev = y, g
        write_params(params, mixed_x)
        set_grads(params, y)
        self.round += 1

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "y": None if self.y is None else self.y.clone(),
                "g_prev": None if self.g_prev is None else self.g_prev.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = state["round"]
        self.y = None if state["y"] is None else state["y"].clone()
        self.g_prev = None if state["g_prev"] is None else state["g_prev"].clone()


class AdaptThenCombineTracking(GradientTracking):
    """Gradient tracking in adapt-then-combine form (ATC-DIGing; Nedić, Olshevsky, Shi 2017)::

        y_i^t     = sum_j W_ij (y_j^{t-1} + g_j^t - g_j^{t-1})       (y_i^0 = sum_j W_ij g_j^0)
        x_i^{t+1} = sum_j W_ij (x_j^t - step(y_j^t))

    Each rank mixes *after* its local change, so its gradient is taken at the mixed model.
    Same bytes as :class:`GradientTracking` (``x`` and ``y`` each once per round), in two
    messages: ``y`` in :meth:`sync`, ``x`` in :meth:`after_step`.
    """

    def sync(self, params: Iterable[nn.Parameter]) -> None:
        params = [p for p in params if p.requires_grad]
        g = self._local_grad(params)
        if g is None:
            return
        if self.y is None:
            y = self.mix(g.clone())
        else:
            assert self.g_prev is not None
            y = self.mix(self.y + g - self.g_prev)
        self.y, self.g_prev = y, g
        set_grads(params, y)

    def after_step(self, params: Iterable[nn.Parameter]) -> None:
        self.mix_models([p for p in params if p.requires_grad])
