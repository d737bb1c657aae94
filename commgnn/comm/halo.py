"""The halo-exchange Protocol every halo strategy implements.

A halo exchange maps the rows a rank owns to the rows it needs from its peers:

    exchange(h: [n_own, d], layer: int) -> [n_halo, d]

It must be differentiable: the backward pass returns each halo row's gradient to the
rank that owns the row, which accumulates it into ``h.grad``. Levers (quantization,
sampling, staleness, ...) wrap another exchange, e.g. ``Quantized(AllToAllHalo(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class HaloPlan:
    """Who sends which rows to whom (from :class:`commgnn.partition.LocalPartition`)."""

    send_index: Tensor
    """``[sum(send_counts)]`` owned rows to send, grouped by destination rank."""
    send_counts: list[int]
    """``[P]`` rows sent to each rank."""
    recv_counts: list[int]
    """``[P]`` rows received from each rank; their sum is ``n_halo``."""

    @property
    def num_halo(self) -> int:
        return sum(self.recv_counts)


@runtime_checkable
class HaloExchange(Protocol):
    """Exchange of boundary rows before a layer's aggregation."""

    def exchange(self, h: Tensor, layer: int) -> Tensor:
        """Return the ``[n_halo, d]`` halo rows for layer ``layer`` given owned rows ``h``."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
