"""Quantized halo messages (after AdaQP): stochastic per-row min/max codes, packed for real.

Forward rows travel as ``bits.forward``-bit codes, gradients as ``bits.backward``-bit
codes (32 = unchanged float32). Each row costs ``ceil(d b / 8) + 8`` bytes (codes plus its
float32 min and step; :mod:`commgnn.comm.quant`), which is what the transport counts.
Unbiased: ``E[decode(encode(x))] = x``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.halo.exchange import RowExchange, Wrapper


class Quantized(Wrapper):
    def __init__(self, inner: RowExchange, *, forward_bits: int, backward_bits: int, seed: int) -> None:
        super().__init__(inner)
        self.forward_bits, self.backward_bits = forward_bits, backward_bits
        self.gen = torch.Generator().manual_seed(seed)

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        bits = self.backward_bits if kind == "halo_bwd" else self.forward_bits
        if bits == 32 or self.exact_now or kind not in ("halo_fwd", "halo_bwd") or not rows.is_floating_point():
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        payload = quant.encode(rows.cpu(), bits, self.gen).to(rows.device)
        got = self.inner.move(payload, out_counts, in_counts, layer, kind)
        return quant.decode(got, bits, rows.shape[1], rows.dtype)

    def own_state(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
