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

The values' codec is fixed bits (``forward_bits`` / ``backward_bits``), or the adaptive
solver's per-peer widths (``adaptive``: the
:class:`~commgnn.comm.halo.adaptive.AdaptiveQuantized` this wraps), which then sizes the k
values of each row under its budget with the indices as a fixed cost per row. In a guard
epoch (``exact_now``) the values travel as fp32: the pairs are then exact.

Written by hand; no library sends top-k rows through ``all_to_all``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from commgnn.comm import quant
from commgnn.comm.halo.adaptive import AdaptiveQuantized
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
        # adaptive widths: the solver this wraps encodes the values per peer. It must be the
        # very next exchange: a lever between would see (index, value) bytes it cannot act on.
        self.adaptive = inner if isinstance(inner, AdaptiveQuantized) else None
        below = inner.inner if isinstance(inner, Wrapper) else None
        while isinstance(below, Wrapper):
            if isinstance(below, AdaptiveQuantized):
                raise ValueError(f"MaxKRows must wrap AdaptiveQuantized directly, not through {type(inner).__name__}")
            below = below.inner
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
        ib, bits = _idx_bytes(d), (self.forward_bits if kind == "halo_fwd" and not self.exact_now else 32)
        idx = rows.abs().topk(self.k, dim=1).indices.sort(dim=1).values  # [n, k]
        vals = rows.gather(1, idx)
        idx_bytes = (idx.to(torch.uint8) if ib == 1 else idx.to(torch.int16)).contiguous().view(torch.uint8)
        idx_bytes = idx_bytes.reshape(rows.shape[0], self.k * ib)
        if self.adaptive is not None and kind == "halo_fwd" and not self.exact_now:
            got, r_vals = self._adaptive_forward(idx_bytes, vals, out_counts, in_counts, layer, rows.dtype)
        else:
            payload = torch.cat([idx_bytes, self._values_out(vals, bits)], dim=1)
            got = self.inner.move(payload, out_counts, in_counts, layer, kind).reshape(n_in, payload.shape[1])
            r_vals = self._values_in(got[:, self.k * ib:], n_in, bits, rows.dtype)
        r_idx = got[:, : self.k * ib].contiguous()
        r_idx = (r_idx.long() if ib == 1 else r_idx.view(torch.int16).long() & 0xFFFF).reshape(n_in, self.k)
        if kind == "halo_fwd":  # on the rows' device, where the backward gathers with them
            self.sent_idx[layer], self.recv_idx[layer] = idx, r_idx.to(rows.device)
        return rows.new_zeros((n_in, d)).scatter_(1, r_idx.to(rows.device), r_vals.to(rows.device))

    def _backward(self, grad: Tensor, out_counts: list[int], in_counts: list[int], layer: int, d: int,
                  n_in: int) -> Tensor:
        """``grad [n_halo, d]`` of the rows this rank received -> ``[n_send, d]`` gradients of
        the rows it sent, non-zero only at the positions it sent."""
        bits = 32 if self.exact_now else self.backward_bits
        vals = grad.gather(1, self.recv_idx[layer].to(grad.device))
        if self.adaptive is not None:  # k-wide value rows: the solver's own exchange sizes them
            back = self.adaptive.move(vals, out_counts, in_counts, layer, "halo_bwd")
        else:
            got = self.inner.move(self._values_out(vals, bits), out_counts, in_counts, layer, "halo_bwd")
            back = self._values_in(got, n_in, bits, grad.dtype)
        return grad.new_zeros((n_in, d)).scatter_(1, self.sent_idx[layer].to(grad.device), back.to(grad.device))

    def _adaptive_forward(self, idx_bytes: Tensor, vals: Tensor, out_counts: list[int], in_counts: list[int],
                          layer: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Forward pairs with the values at the solver's per-peer widths: each peer's block
        is ``[n_q, k ib + bytes_per_row(k, b_q)]`` (indices, then codes). Returns the received
        ``[n_in, k ib]`` indices (as the first columns of a byte tensor) and ``[n_in, k]`` values."""
        ada, ib = self.adaptive, idx_bytes.shape[1]
        assert ada is not None
        codes = ada.encode(vals, out_counts, layer, "halo_fwd", fixed_bytes=ib)
        parts = [torch.cat([i, c], dim=1).reshape(-1) for i, c in zip(idx_bytes.cpu().split(out_counts), codes)]
        width = [ib + ada.row_bytes(layer, "halo_fwd", self.k, q) for q in range(len(in_counts))]
        in_bytes = [c * w for c, w in zip(in_counts, width)]
        got = ada.send(torch.cat(parts).to(vals.device), [p.numel() for p in parts], in_bytes, layer, "halo_fwd")
        blocks = [x.view(c, w) for x, c, w in zip(torch.split(got.cpu(), in_bytes), in_counts, width)]
        r_vals = ada.decode([b[:, ib:].contiguous() for b in blocks], layer, "halo_fwd", self.k, dtype)
        return torch.cat([b[:, :ib] for b in blocks]), r_vals

    def own_state(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
