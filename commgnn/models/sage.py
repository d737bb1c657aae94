"""GraphSAGE-mean layer on a rank's local graph, weight-compatible with PyG's ``SAGEConv``.

    out_i = W_l mean_{j -> i} h_j + b_l + W_r h_i      H: [n_src, d_in] -> out: [n_own, d_out]

All in-edges of an owned node are local, so the mean is exact. Parameters are named
``lin_l.weight``, ``lin_l.bias`` and ``lin_r.weight`` as in PyG.
"""

from __future__ import annotations

from torch import Tensor, nn

from commgnn.models.graph import LocalGraph, spmm


class SAGELayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, h: Tensor, graph: LocalGraph) -> Tensor:
        agg = spmm(graph.mean_adj(h.dtype), h)
        return self.lin_l(agg) + self.lin_r(h[: graph.num_own])
