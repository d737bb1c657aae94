"""The one-time exchange of constant input rows, sent sparse and lossless.

``precompute`` (and the sparse-input pattern of the first layer) move the raw feature rows
of the halo once, before training (traffic class ``halo_setup``). Raw features of the usual
graphs are mostly zeros: bag-of-words rows of Coauthor CS keep 59.6 of 6,805 entries,
Physics 33.0 of 8,415, all of them 1.0. A dense fp32 row costs ``4 d`` bytes; this wrapper
sends rank r's rows for peer q as one block of :mod:`commgnn.comm.sparse_codec` (index lists
or bitmaps, values left out when all are 1.0, dense where that is smaller). Blocks have a
size per peer, so an all-to-all of the block sizes (one ``int64`` per peer that gets rows,
class ``control``) comes first: two collectives instead of one, for a set-up that runs once.
Every other traffic class passes through untouched.

Written by hand: no maintained library ships a sparse all-to-all for torch.distributed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from commgnn.comm.halo.exchange import Wrapper
from commgnn.comm.sparse_codec import decode_block, encode_block, exchange_blocks


class SparseSetup(Wrapper):
    """Sends ``halo_setup`` rows (constant inputs, no gradient) in the formats of the module
    docstring; every other class goes to the inner strategy unchanged."""

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int, kind: str) -> Tensor:
        if kind != "halo_setup" or rows.dim() != 2 or not rows.is_floating_point():
            return self.inner.move(rows, out_counts, in_counts, layer, kind)
        d = rows.shape[1]
        # A peer with no rows gets no block and no size (both sides know the count is 0).
        blocks = [encode_block(b) if n else rows.new_zeros((0,), dtype=torch.uint8)
                  for b, n in zip(rows.split(list(out_counts)), out_counts)]

        def a2a(t: Tensor, out: list[int], into: list[int]) -> Tensor:
            return self.inner.move(t, out, into, layer, kind if t.dtype == torch.uint8 else "control")

        got = exchange_blocks(blocks, [n > 0 for n in in_counts], a2a, rows.device)
        out = [decode_block(p, n, d, rows.dtype) for p, n in zip(got, in_counts) if n]
        return torch.cat(out) if out else rows.new_zeros((0, d))
