"""What a training step does when its loss or a gradient is not finite (``train.on_nonfinite``).

``stop`` (the default): the rank that sees it raises :class:`~commgnn.errors.Diverged`
before the optimiser applies anything, naming the epoch and the first non-finite quantity
(the loss, else the first parameter in the model's order whose gradient holds a NaN or an
infinity). The run ends with exit code 1 and ``status.json`` ``failed``; no checkpoint is
written for that epoch, so the last good one is kept. Its peers stop at their next
collective, as after any rank's failure.

``skip_step``: every rank learns whether any rank saw one (one all-reduce of a flag per step,
counted as control traffic); if so, each zeroes its gradients and the step applies no update
(the schedule still advances). The step's loss is still reported (as ``null`` in
``metrics.jsonl`` when it is not finite).

The check is local and cheap: one ``isfinite`` reduction per parameter, one host sync.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from commgnn.errors import Diverged


def first_nonfinite(loss: torch.Tensor, named_params: Iterable[tuple[str, nn.Parameter]]) -> str | None:
    """The first non-finite quantity of a step, in words (``"loss (nan)"``, ``"gradient of
    'layers.0.weight'"``), or None when the loss and every gradient are finite."""
    named = [(n, p.grad) for n, p in named_params if p.grad is not None]
    # one host sync for the common case (all finite); names only on failure
    finite = torch.stack([torch.isfinite(loss.detach()).all(),
                          *(torch.isfinite(g).all().to(loss.device) for _, g in named)])
    if bool(finite.all()):
        return None
    if not bool(finite[0]):
        return f"loss ({float(loss.detach().reshape(-1)[0])})"
    return f"gradient of {named[int((~finite[1:]).nonzero()[0])][0]!r}"


def guard_step(mode: str, loss: torch.Tensor, model: nn.Module, *, epoch: int, rank: int,
               any_rank: Callable[[torch.Tensor], torch.Tensor] | None = None) -> bool:
    """Apply ``train.on_nonfinite`` to a step whose backward pass just ran: raise
    :class:`Diverged` (``stop``) or return True when the step must apply no update
    (``skip_step``; gradients zeroed). ``any_rank`` sums a 1-element float64 tensor over
    ranks (None for one rank); under ``skip_step`` every rank must call this together."""
    bad = first_nonfinite(loss, model.named_parameters())
    if mode == "stop":
        if bad is not None:
            raise Diverged(f"training diverged at epoch {epoch}: non-finite {bad} on rank {rank} (stopped; "
                           f"train.on_nonfinite = 'skip_step' would skip such steps instead)")
        return False
    flag = torch.tensor([0.0 if bad is None else 1.0], dtype=torch.float64)
    if any_rank is not None:
        flag = any_rank(flag)
    if float(flag[0]) == 0.0:
        return False
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    return True
