"""GraphSAGE-mean layer on a rank's local graph, weight-compatible with PyG's ``SAGEConv``.

    out_i = W_l mean_{j -> i} h_j + b_l + W_r h_i      H: [n_src, d_in] -> out: [n_own, d_out]

All in-edges of an owned node are local, so the mean is exact. Parameters are named
``lin_l.weight``, ``lin_l.bias`` and ``lin_r.weight`` as in PyG. With ``transform_first``
(when ``d_out < d_in``) rows travel as ``h W_l^T`` (the mean is linear, so
``mean(h W_l^T) = W_l mean(h)``); ``precompute`` takes the mean of the constant input once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from commgnn.models.graph import CSRPair, LocalGraph, spmm
from commgnn.models.sparse import Projector, dense_proj


class SAGELayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False) -> None:
        super().__init__()
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)
        self.transform_first = transform_first and out_dim < in_dim

    def message(self, h: Tensor, proj: Projector = dense_proj) -> Tensor:
        return proj(h, self.lin_l.weight) if self.transform_first else h

    def combine(self, m_src: Tensor, h_own: Tensor, graph: LocalGraph, proj_src: Projector = dense_proj,
                proj_own: Projector = dense_proj) -> Tensor:
        mean = graph.mean_adj(m_src.dtype)
        if self.transform_first:
            out = spmm(mean, m_src) + self.lin_l.bias
        elif proj_src is dense_proj:
            out = self.lin_l(spmm(mean, m_src))  # PyG's order: aggregate, then transform
        else:  # a sparse input: transform its few non-zeros first (the mean is linear)
            out = spmm(mean, proj_src(m_src, self.lin_l.weight)) + self.lin_l.bias
        return out + proj_own(h_own, self.lin_r.weight)

    def aggregation(self, graph: LocalGraph, dtype: torch.dtype) -> CSRPair:
        """The operator ``A`` this layer aggregates with, ``[n_own, n_src]``."""
        return graph.mean_adj(dtype)

    def precompute(self, x_src: Tensor, graph: LocalGraph) -> Tensor:
        return spmm(self.aggregation(graph, x_src.dtype), x_src)

    def from_precomputed(self, pre: Tensor, x_own: Tensor, graph: LocalGraph, proj_pre: Projector = dense_proj,
                         proj_own: Projector = dense_proj) -> Tensor:
        return proj_pre(pre, self.lin_l.weight) + self.lin_l.bias + proj_own(x_own, self.lin_r.weight)
