"""Halo rows of a MaxK model as k (index, value) pairs; gradients back as k values.

After a MaxK activation (:mod:`commgnn.models.maxk`) every row of layers ``sparse_layers``
has at most k non-zeros, so the forward exchange sends, per row,

    idx  [k]  uint8 (d <= 256) or uint16        the positions (topk of |row|)
    vals [k]  float32, or the row codec's b-bit codes of the k values (``value_bits``)

that is ``k (1 or 2) + 4k`` bytes instead of ``4 d``: 20x fewer at d = 256, k = 16. The
receiver scatters them into a dense ``[n, d]`` row block; the result equals the dense
exchange of the masked rows exactly (fp32 values). Backward: the gradient of a MaxK
output is zero off its top-k positions (straight-through on the kept ones), so the
receiver sends back only ``grad[i, idx_i]``, k values per row, and the owner scatters
them at the indices it sent: the indices are not sent again. Both sides keep the last
forward's index tables per layer (``halo_eval`` exchanges keep none: no backward).

Written by hand; no library sends top-k rows through ``all_to_all``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.halo.exchange import RowExchange, Wrapper


def _idx_bytes(d: int) -> int:
    return 1 if d <= 256 else 2


def _val_bytes(k: int, bits: int) -> int:
    return 4 * k if bits == 32 else quant.bytes_per_row(k, bits)


class MaxKRows(Wrapper):
    """Sparse (index, value) messages for the halo rows of MaxK layers."""

    def __init__(self, inner: RowExchange, *, k: int, sparse_layers: set[int], forward_bits: int = 32,
                 backward_bits: int = 32, seed: int = 0) -> None:
        super().__init__(inner)
        self.k, self.layers = k, set(sparse_layers)
        self.forward_bits, self.backward_bits = forward_bits, backward_bits
        self.gen = torch.Generator().manual_seed(seed)
        self.sent_idx: dict[int, Tensor] = {}  # layer -> [n_send, k] positions this rank sent
        self.recv_idx: dict[int, Tensor] = {}  # layer -> [n_halo, k] positions it received

    def _values_out(self, vals: Tensor, bits: int) -> Tensor:
        if bits == 32:
            return vals.float().contiguous().view(torch.uint8).reshape(vals.shape[0], 4 * self.k)
        # encoded on the CPU, where the stochastic-rounding generator lives
        return quant.encode(vals.float().cpu(), bits, self.gen).to(vals.device)

    def _values_in(self, payload: Tensor, n: int, bits: int, dtype: torch.dtype) -> Tensor:
        if bits == 32:
            return payload.contiguous().view(torch.float32).reshape(n, self.k).to(dtype)
        return quant.decode(payload.reshape(n, quant.bytes_per_row(self.k, bits)), bits, self.k, dtype)

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int, kind: str) -> Tensor:
        d = rows.shape[1] if rows.dim() == 2 else 0
        if (layer not in self.layers or not rows.is_floating_point() or self.k >= d
                or kind not in ("halo_fwd", "halo_bwd", "halo_eval")):
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        n_in = sum(in_counts)
        if kind == "halo_bwd":
            return self._backward(rows, out_counts, in_counts, layer, d, n_in)
        if rows.shape[0] and int((rows != 0).sum(1).max()) > self.k:
            raise RuntimeError(f"layer {layer}: a halo row has more than k = {self.k} non-zeros; MaxK messages "
                               "need the MaxK activation's output (is transform-first on for this layer?)")
        ib, bits = _idx_bytes(d), (self.forward_bits if kind == "halo_fwd" else 32)
        idx = rows.abs().topk(self.k, dim=1).indices.sort(dim=1).values  # [n, k]
        vals = rows.gather(1, idx)
        idx_bytes = (idx.to(torch.uint8) if ib == 1 else idx.to(torch.int16)).contiguous().view(torch.uint8)
        payload = torch.cat([idx_bytes.reshape(rows.shape[0], self.k * ib), self._values_out(vals, bits)], dim=1)
        width = payload.shape[1]
        got = self.inner.move(payload, out_counts, in_counts, layer, kind).reshape(n_in, width)
        r_idx = got[:, : self.k * ib].contiguous()
        r_idx = (r_idx.long() if ib == 1 else r_idx.view(torch.int16).long() & 0xFFFF).reshape(n_in, self.k)
        r_vals = self._values_in(got[:, self.k * ib:], n_in, bits, rows.dtype)
        if kind == "halo_fwd":
            self.sent_idx[layer], self.recv_idx[layer] = idx, r_idx
        return rows.new_zeros((n_in, d)).scatter_(1, r_idx.to(rows.device), r_vals.to(rows.device))

    def _backward(self, grad: Tensor, out_counts: list[int], in_counts: list[int], layer: int, d: int,
                  n_in: int) -> Tensor:
        """``grad [n_halo, d]`` of the rows this rank received -> ``[n_send, d]`` gradients of
        the rows it sent, non-zero only at the positions it sent."""
        bits = self.backward_bits
        vals = grad.gather(1, self.recv_idx[layer].to(grad.device))
        got = self.inner.move(self._values_out(vals, bits), out_counts, in_counts, layer, "halo_bwd")
        back = self._values_in(got, n_in, bits, grad.dtype)
        return grad.new_zeros((n_in, d)).scatter_(1, self.sent_idx[layer].to(grad.device), back.to(grad.device))

    def own_state(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
