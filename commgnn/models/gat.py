"""GAT layer on a rank's local graph (Velickovic et al.), weight-compatible with PyG's ``GATConv``.

With ``X' = H W^T`` viewed as ``[n_src, heads, C]`` and self loops on owned nodes::

    e_ij     = LeakyReLU(<a_src, X'_j> + <a_dst, X'_i>, 0.2)          for j -> i
    alpha_ij = softmax_j(e_ij)       over i's whole neighbourhood, halo rows included
    out_i    = concat_h (or mean_h) sum_j alpha_ij X'_j + b

Every in-edge of an owned node is local, so the softmax is exact. Parameters are named
``lin.weight``, ``att_src``, ``att_dst``, ``bias`` as in PyG. Edge-wise gather/scatter
(``torch_geometric.utils.softmax`` and ``index_add_``) does the attention, or, on a graph
with ``kernel = "numba"``, the fused kernel :func:`commgnn.kernels.gat_attend` (not with
attention dropout in training, which needs the per-edge coefficients in torch). The message is
``H`` or, with ``transform_first`` when ``heads C < d_in``, ``X'`` itself (the attention
needs nothing else of a source row). ``precompute`` keeps the constant input's halo rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import softmax

from commgnn import kernels
from commgnn.models.dropout import dropout
from commgnn.models.graph import LocalGraph
from commgnn.models.sparse import Projector, dense_proj


class GATLayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, heads: int, concat: bool = True,
                 attn_dropout: float = 0.0, transform_first: bool = False) -> None:
        super().__init__()
        self.heads, self.out_dim, self.concat, self.attn_dropout = heads, out_dim, concat, attn_dropout
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        for p in (self.lin.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(p)
        self.transform_first = transform_first and heads * out_dim < in_dim

    def message(self, h: Tensor, proj: Projector = dense_proj) -> Tensor:
        return proj(h, self.lin.weight) if self.transform_first else h

    def combine(self, m_src: Tensor, h_own: Tensor, graph: LocalGraph, proj_src: Projector = dense_proj,
                proj_own: Projector = dense_proj) -> Tensor:
        return self._attend(m_src if self.transform_first else proj_src(m_src, self.lin.weight), graph)

    def precompute(self, x_src: Tensor, graph: LocalGraph) -> Tensor:
        return x_src

    def from_precomputed(self, pre: Tensor, x_own: Tensor, graph: LocalGraph, proj_pre: Projector = dense_proj,
                         proj_own: Projector = dense_proj) -> Tensor:
        return self._attend(proj_pre(pre, self.lin.weight), graph)  # the cache holds raw input rows

    def _attend(self, xw: Tensor, graph: LocalGraph) -> Tensor:
        """Attention and aggregation of transformed rows ``xw: [n_src, heads * C]``."""
        n_own = graph.num_own
        x = xw.view(-1, self.heads, self.out_dim)
        a_src = (x * self.att_src).sum(-1)                                # [n_src, H]
        a_dst = (x[:n_own] * self.att_dst).sum(-1)                        # [n_own, H]
        fused = graph.fused_attention()
        if fused is not None and not (self.training and self.attn_dropout > 0):
            out = kernels.gat_attend(x, a_src, a_dst, fused)
            out = out.reshape(n_own, -1) if self.concat else out.mean(dim=1)
            return out + self.bias
        src, dst = graph.edges_with_self_loops()
        e = F.leaky_relu(a_src[src] + a_dst[dst], 0.2)                    # [E, H]
        alpha = softmax(e, dst, num_nodes=n_own)
        alpha = dropout(alpha, p=self.attn_dropout, training=self.training)
        out = x.new_zeros(n_own, self.heads, self.out_dim)
        out.index_add_(0, dst, x[src] * alpha.unsqueeze(-1))            # [n_own, H, C]
        out = out.reshape(n_own, -1) if self.concat else out.mean(dim=1)
        return out + self.bias
