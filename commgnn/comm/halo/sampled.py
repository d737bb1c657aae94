"""Boundary-node sampling (after BNS-GCN): each epoch send a fraction p of boundary rows.

The sample of the rows rank s sends to rank r in epoch t is ``U < p`` with ``U`` drawn
from a generator seeded by ``(seed, t, s, r)``; sender and receiver draw it alike, so no
node ids travel. Kept rows are scaled by ``1/p`` and the others arrive as zeros, so every
aggregate ``sum_j a_ij h_j`` stays unbiased. The backward pass returns gradients of the
same sample (also scaled by 1/p: it is the derivative of the forward map).
"""

from __future__ import annotations

import torch
from torch import Tensor

from commgnn.comm.halo.exchange import RowExchange, Wrapper


class Sampled(Wrapper):
    def __init__(self, inner: RowExchange, *, rate: float, seed: int, rank: int) -> None:
        super().__init__(inner)
        self.rate, self.seed, self.rank = rate, seed, rank
        self._masks: dict[tuple[int, int, int], Tensor] = {}

    def set_epoch(self, epoch: int, exact: bool) -> None:
        self._masks.clear()  # a new epoch, a new sample
        super().set_epoch(epoch, exact)

    def pair_mask(self, src: int, dst: int, count: int) -> Tensor:
        """Which of the ``count`` rows ``src`` sends ``dst`` this epoch are kept."""
        key = (src, dst, count)
        if key not in self._masks:
            g = torch.Generator().manual_seed(hash((self.seed, self.epoch, src, dst)) & 0x7FFF_FFFF_FFFF)
            self._masks[key] = torch.rand(count, generator=g) < self.rate
        return self._masks[key]

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        if self.rate >= 1.0 or self.exact_now or kind not in ("halo_fwd", "halo_bwd"):
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        me, P = self.rank, len(out_counts)
        # forward: I send (me -> q) and receive (q -> me); backward swaps the roles
        fwd = kind != "halo_bwd"
        keep_out = torch.cat([self.pair_mask(me, q, out_counts[q]) if fwd else self.pair_mask(q, me, out_counts[q])
                              for q in range(P)]).to(rows.device)
        keep_in = torch.cat([self.pair_mask(q, me, in_counts[q]) if fwd else self.pair_mask(me, q, in_counts[q])
                             for q in range(P)]).to(rows.device)
        out_kept, in_kept = block_sums(keep_out, out_counts), block_sums(keep_in, in_counts)
        got = self.inner.move(rows[keep_out] / self.rate, out_kept, in_kept, layer, kind)
        full = rows.new_zeros((sum(in_counts), *rows.shape[1:]))
        full[keep_in] = got.to(full.dtype)
        return full


def block_sums(mask: Tensor, counts: list[int]) -> list[int]:
    """Set entries of ``mask`` in each consecutive block of ``counts``."""
    return [int(b.sum()) for b in torch.split(mask, counts)]
