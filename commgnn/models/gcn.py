"""GCN layer on a rank's local graph (Kipf & Welling), weight-compatible with PyG's ``GCNConv``.

    out = D^-1/2 (A + I) D^-1/2 (H W^T) + b        H: [n_src, d_in] -> out: [n_own, d_out]

``D`` holds *global* degrees (halo rows included), so the result on owned rows equals
``GCNConv`` on the whole graph. Parameters are named ``lin.weight`` and ``bias`` as in
PyG, so a state dict loads into either.

What crosses the cut is the layer's *message*: ``H`` itself, or with ``transform_first``
(when ``d_out < d_in``) the narrower ``H W^T``: the same numbers, since ``W`` acts row by
row. ``precompute`` aggregates the (constant) input once: ``(A_hat X) W^T`` = ``A_hat (X W^T)``.

Locally, the same associativity picks the cheaper order. A rank has ``n_src = n_own +
n_halo`` source rows (on a large cut graph ``n_halo`` exceeds ``n_own`` several times), and
transforming first multiplies all of them and keeps them for the weight's gradient::

    transform first:  n_src d_in d_out + nnz d_out  flops, saves [n_src, d_in]
    aggregate first:  nnz d_in + n_own d_in d_out   flops, saves [n_own, d_in]

so dense rows are aggregated first whenever that costs fewer flops (always when
``d_in <= d_out``). A sparse input pattern is transformed first: its few non-zeros are
cheaper to multiply than its dense aggregate.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from commgnn.models.graph import CSRPair, LocalGraph, spmm
from commgnn.models.sparse import Projector, dense_proj


class GCNLayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, transform_first: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)  # PyG's glorot init
        self.transform_first = transform_first and out_dim < in_dim

    def message(self, h: Tensor, proj: Projector = dense_proj) -> Tensor:
        """What owned rows send: ``[n_own, d_in]`` or ``[n_own, d_out]`` (transform first)."""
        return proj(h, self.lin.weight) if self.transform_first else h

    def combine(self, m_src: Tensor, h_own: Tensor, graph: LocalGraph, proj_src: Projector = dense_proj,
                proj_own: Projector = dense_proj) -> Tensor:
        """``[n_src, d_msg]`` messages of owned+halo rows -> ``[n_own, d_out]``. The projectors
        compute ``rows W^T`` (dense, or on a sparse input pattern)."""
        adj = graph.gcn_adj(m_src.dtype)
        if self.transform_first:
            return spmm(adj, m_src) + self.bias
        if proj_src is dense_proj and self._aggregate_first(graph.num_own, m_src.shape[0], adj.a.values().numel()):
            return dense_proj(spmm(adj, m_src), self.lin.weight) + self.bias
        return spmm(adj, proj_src(m_src, self.lin.weight)) + self.bias

    def _aggregate_first(self, n_own: int, n_src: int, nnz: int) -> bool:
        d_out, d_in = self.lin.weight.shape
        return nnz * d_in + n_own * d_in * d_out <= n_src * d_in * d_out + nnz * d_out

    def aggregation(self, graph: LocalGraph, dtype: torch.dtype) -> CSRPair:
        """The operator ``A`` this layer aggregates with, ``[n_own, n_src]``."""
        return graph.gcn_adj(dtype)

    def precompute(self, x_src: Tensor, graph: LocalGraph) -> Tensor:
        """``A_hat X``: ``[n_own, d_in]``, computed once for a constant input."""
        return spmm(self.aggregation(graph, x_src.dtype), x_src)

    def from_precomputed(self, pre: Tensor, x_own: Tensor, graph: LocalGraph, proj_pre: Projector = dense_proj,
                         proj_own: Projector = dense_proj) -> Tensor:
        return proj_pre(pre, self.lin.weight) + self.bias
