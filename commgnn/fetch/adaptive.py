"""Adaptive bit-widths for fetched feature rows (the halo exchange's AdaQP-style solver,
:func:`commgnn.comm.halo.adaptive.solve_bits`, applied to the fetch).

The *asker* chooses the width of the rows it receives from each owner, so that its
feature bytes per epoch fit ``budget_bytes``: from the rows received from owner o in the
last epoch (count ``n_o`` and the sum of their squared ranges ``R2_o``, read off the codes'
headers) the solver minimises the summed stochastic-rounding variance
``sum_o d R2_o / (4 (2^b_o - 1)^2)`` subject to ``sum_o n_o bytes_per_row(d, b_o) <= budget``
(greedy, largest variance cut per byte first). The widths travel with the request counts
(one extra integer per peer), so owner and asker agree without another collective. The
first epoch uses 8 bits. A width of 32 sends float32 rows as they are.

Replies to different askers then have different widths, so they travel as one byte
buffer with per-peer byte splits (each side computes them from the counts and widths).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.halo.adaptive import solve_bits


def row_bytes(d: int, bits: int, element_size: int = 4) -> int:
    """Bytes of one ``d``-wide row at ``bits`` (32 = raw values)."""
    return d * element_size if bits == 32 else quant.bytes_per_row(d, bits)


def encode_rows(rows: Tensor, bits: int, gen: torch.Generator) -> Tensor:
    """``[n, d]`` rows -> flat ``uint8`` payload at ``bits``."""
    if bits == 32:
        return rows.contiguous().view(torch.uint8).reshape(-1)
    return quant.encode(rows, bits, gen).reshape(-1)


def decode_rows(payload: Tensor, n: int, d: int, bits: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Flat payload of ``n`` rows -> ``([n, d]`` rows, ``[n]`` squared ranges)."""
    if bits == 32:
        rows = payload.reshape(n, -1).view(dtype)
        rng = (rows.max(dim=1).values - rows.min(dim=1).values) if n and d else rows.new_zeros(n)
        return rows, rng.to(torch.float64) ** 2
    coded = payload.reshape(n, quant.bytes_per_row(d, bits))
    header = coded[:, -8:].clone().reshape(-1).view(torch.float32).view(n, 2)
    step = header[:, 1].to(torch.float64)
    return quant.decode(coded, bits, d, dtype), (step * ((1 << bits) - 1)) ** 2


class AdaptiveBits:
    """Per-owner widths of the rows this rank receives, re-solved every epoch."""

    def __init__(self, world_size: int, width: int, budget_bytes: float) -> None:
        self.width, self.budget = width, budget_bytes
        self.bits = [8] * world_size
        """Width of the rows received from each owner (this rank's own entry unused)."""
        self.r2 = torch.zeros(world_size, dtype=torch.float64)
        self.rows = torch.zeros(world_size, dtype=torch.int64)

    def observe(self, owner: int, r2: Tensor) -> None:
        """Rows just received from ``owner`` and their squared ranges ``[n]``."""
        self.r2[owner] += float(r2.sum())
        self.rows[owner] += int(r2.numel())

    def end_epoch(self) -> None:
        """Choose next epoch's widths from this epoch's rows (those seen), then forget them."""
        stats = {(0, 0, o): (float(self.r2[o]), int(self.rows[o]), self.width)
                 for o in range(len(self.bits)) if self.rows[o] > 0}
        if stats:
            for (_, _, o), b in solve_bits(stats, self.budget).items():
                self.bits[o] = b
        self.r2.zero_()
        self.rows.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"bits": list(self.bits), "r2": self.r2.clone(), "rows": self.rows.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bits = list(state["bits"])
        self.r2.copy_(state["r2"])
        self.rows.copy_(state["rows"])
