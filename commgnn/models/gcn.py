"""GCN layer on a rank's local graph (Kipf & Welling), weight-compatible with PyG's ``GCNConv``.

    out = D^-1/2 (A + I) D^-1/2 (H W^T) + b        H: [n_src, d_in] -> out: [n_own, d_out]

``D`` holds *global* degrees (halo rows included), so the result on owned rows equals
``GCNConv`` on the whole graph. Parameters are named ``lin.weight`` and ``bias`` as in
PyG, so a state dict loads into either.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from commgnn.models.graph import LocalGraph, spmm


class GCNLayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)  # PyG's glorot init

    def forward(self, h: Tensor, graph: LocalGraph) -> Tensor:
        return spmm(graph.gcn_adj(h.dtype), self.lin(h)) + self.bias
