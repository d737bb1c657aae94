"""MaxK activation (MaxK-GNN, Peng et al., ASPLOS 2024): keep each row's k largest entries.

    maxk(h)[i, j] = h[i, j] if j is among the k largest entries of row i, else 0     h: [n, d]

The backward pass is straight-through on the kept entries: ``grad_h = grad_out * mask``,
the mask of the forward's top-k positions (what autograd gives for ``h * mask`` with the
mask held constant). Rows leave the activation with at most k non-zeros, which is what
:class:`commgnn.comm.halo.maxk_rows.MaxKRows` sends as (index, value) pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor


def maxk(h: Tensor, k: int) -> Tensor:
    """``[n, d] -> [n, d]`` with all but each row's k largest entries zeroed (k >= d: h)."""
    if k >= h.shape[1]:
        return h
    idx = h.detach().topk(k, dim=1).indices
    mask = torch.zeros_like(h, dtype=torch.bool).scatter_(1, idx, True)
    return h * mask
