"""The gradient-synchronisation Protocol every gradient strategy implements.

After the backward pass each rank holds the gradient of *its share* of the global loss
(the trainer divides each rank's loss sum by the global number of training nodes), so the
exact full-graph gradient is the **sum** over ranks. A strategy leaves that sum (or its
approximation) in every parameter's ``.grad``.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class GradSync(Protocol):
    def sync(self, params: Iterable[nn.Parameter]) -> None:
        """Replace each ``p.grad`` by the (approximate) sum of that gradient over ranks."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
