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

    def exchange(self, h: Tensor, layer: int, kind: str | None = None) -> Tensor:
        """Return the ``[n_halo, d]`` halo rows for layer ``layer`` given owned rows ``h``
        (``kind``: the traffic class to count them as; default by grad mode)."""
        ...

    def set_epoch(self, epoch: int, exact: bool) -> None:
        """Before each training epoch; ``exact`` asks for an exact (guard) epoch."""
        ...

    def flush(self) -> None:
        """After the backward pass: finish anything in flight."""
        ...

    def epoch_log(self) -> dict[str, Any]:
        """Facts to log for the epoch (e.g. chosen bit-widths)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
