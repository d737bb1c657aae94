"""The gradient-synchronisation Protocol every gradient strategy implements.

After the backward pass each rank holds the gradient of *its share* of the global loss
(the trainer divides each rank's loss sum by the global number of training nodes), so the
exact full-graph gradient is the **sum** over ranks. A strategy leaves that sum (or its
approximation) in every parameter's ``.grad``.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

import torch
from torch import Tensor, nn


@runtime_checkable
class GradSync(Protocol):
    def sync(self, params: Iterable[nn.Parameter]) -> None:
        """Replace each ``p.grad`` by the (approximate) sum of that gradient over ranks."""
        ...

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to run forward through (DDP-based strategies wrap the model)."""
        ...

    def after_step(self, params: Iterable[nn.Parameter]) -> None:
        """After the optimiser step (e.g. periodic model averaging)."""
        ...

    def set_lr(self, lr: float) -> None:
        """The learning rate of the coming step (for strategies that need it)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GradSyncBase:
    """Defaults for the optional parts of :class:`GradSync`."""

    decentralised = False
    """True when ranks keep different models (gossip): evaluation then uses their average."""
    owns_momentum = False
    """True when the strategy applies the momentum itself (DGC's momentum correction): the
    trainer's SGD then runs without its own, so that momentum is not applied twice."""

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def after_step(self, params: Iterable[nn.Parameter]) -> None:
        pass

    def set_lr(self, lr: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def flat_grads(params: list[nn.Parameter]) -> Tensor:
    """All gradients as one vector ``[sum numel]`` (zeros where a parameter has none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_grads(params: list[nn.Parameter], flat: Tensor) -> None:
    """Inverse of :func:`flat_grads`: each ``p.grad`` becomes its slice of ``flat`` (copied,
    in the parameter's dtype and on its device)."""
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).to(p.dtype).to(p.device).clone()
        offset += p.numel()
