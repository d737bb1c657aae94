"""GraphSAGE-mean layer on a rank's local graph, weight-compatible with PyG's ``SAGEConv``.

    out_i = W_l mean_{j -> i} h_j + b_l + W_r h_i      H: [n_src, d_in] -> out: [n_own, d_out]

All in-edges of an owned node are local, so the mean is exact. Parameters are named
``lin_l.weight``, ``lin_l.bias`` and ``lin_r.weight`` as in PyG. With ``transform_first``
(when ``d_out < d_in``) rows travel as ``h W_l^T`` (the mean is linear, so
``mean(h W_l^T) = W_l mean(h)``); ``precompute`` takes the mean of the constant input once.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.models.graph import LocalGraph, spmm


class SAGELayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False) -> None:
        super().__init__()
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)
        self.transform_first = transform_first and out_dim < in_dim

    def message(self, h: Tensor) -> Tensor:
        return F.linear(h, self.lin_l.weight) if self.transform_first else h

    def combine(self, m_src: Tensor, h_own: Tensor, graph: LocalGraph) -> Tensor:
        agg = spmm(graph.mean_adj(m_src.dtype), m_src)
        out = agg + self.lin_l.bias if self.transform_first else self.lin_l(agg)
        return out + self.lin_r(h_own)

    def precompute(self, x_src: Tensor, graph: LocalGraph) -> Tensor:
        return spmm(graph.mean_adj(x_src.dtype), x_src)

    def from_precomputed(self, pre: Tensor, x_own: Tensor, graph: LocalGraph) -> Tensor:
        return self.lin_l(pre) + self.lin_r(x_own)
