"""The clients' model: a two-layer GCN on a client's subgraph, with an optional term for
the neighbours that other clients own.

    H   = ReLU( Â (X W1) + C1 + b1 )          X: [n_c, F], W1: [F, h], C1: [n_c, h]
    out = Â (H W2) + C2 + b2                   W2: [h, classes], C2: [n_c, classes]

``Â = D^-1/2 (A_c + I) D^-1/2`` over the client's own edges ``A_c``. With cross-client
edges dropped, ``D`` counts only those; with ``cross_edges = "embeddings"`` it is the
node's degree in the whole graph (a client knows its nodes' neighbours, not their
features), and ``C_v = sum_{u -> v, u elsewhere} d_v^-1/2 s_u`` adds what crosses:
``s_u = d_u^-1/2 x_u W1`` (layer 1) and ``d_u^-1/2 h_u W2`` (layer 2, ``h_u`` the owner's
first-layer output under its own ``C1``), computed by ``u``'s owner with the round's global
weights and protected (quantised, noised) before they leave. ``C1``, ``C2`` are constants
within the round, so no gradient crosses a client boundary. With fresh fp32 embeddings the
model equals the whole graph's GCN exactly (evaluation mode).

Written here (not PyG's ``GCNConv``) because the cross terms need the transform split from
the aggregation; the operator and its kernel are the project's own (``LocalGraph.gcn_adj``,
``spmm``: PyG's ``gcn_norm`` with self-loops of weight 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.models.dropout import dropout as inverted_dropout
from commgnn.models.graph import CSRPair, LocalGraph, spmm


def gcn_operator(edge_index: Tensor, num_nodes: int, degree: Tensor | None = None) -> CSRPair:
    """``D^-1/2 (A + I) D^-1/2`` over ``[2, E]`` (source, target) edges, normalised by
    ``degree`` (default: ``A``'s in-degrees): the project's own GCN operator
    (:meth:`commgnn.models.graph.LocalGraph.gcn_adj`) on a client's whole subgraph."""
    if degree is None:
        degree = torch.bincount(edge_index[1], minlength=num_nodes)
    graph = LocalGraph(num_own=num_nodes, num_src=num_nodes, edge_index=edge_index, in_degree=degree)
    return graph.gcn_adj(torch.float32)


def feature_operator(x: Tensor) -> Tensor | CSRPair:
    """``x`` as the first layer multiplies it: a :class:`CSRPair` when under 10% of it is
    non-zero (bag-of-words features: ``X W1`` then costs ``nnz(X) h``, forward and
    backward), else ``x`` itself."""
    density = float((x != 0).float().mean()) if x.numel() else 1.0
    if density >= 0.1:
        return x
    nz = x.nonzero().t()
    return CSRPair.build(nz[0], nz[1], x[nz[0], nz[1]], (x.shape[0], x.shape[1]))


@dataclass
class RowBlocks:
    """Features as two row blocks, ``[head; tail]``: a client's own (often sparse) rows and
    the dense rows appended after them (neighgen's generated neighbours), so the sparse
    product stays sparse."""

    head: Tensor | CSRPair
    tail: Tensor


class FedGCN(nn.Module):
    """Two GCN layers whose parameters are what clients and server exchange."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(in_dim, hidden))
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.w2 = nn.Parameter(torch.empty(hidden, num_classes))
        self.b2 = nn.Parameter(torch.zeros(num_classes))
        for w in (self.w1, self.w2):  # Glorot, as GCNConv
            bound = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
            nn.init.uniform_(w, -bound, bound)
        self.dropout = dropout

    def embed(self, x: Tensor | CSRPair | RowBlocks) -> Tensor:
        """``x W1``: ``[n, F] -> [n, h]`` (what crosses to other clients, before scaling).
        Sparse features come as a :class:`CSRPair` (``X`` and ``X^T`` in CSR): ``W1``'s
        gradient ``X^T G`` then runs on the kept transpose, 3x faster than autograd's sparse
        backward on Coauthor CS's bag-of-words rows."""
        if isinstance(x, RowBlocks):
            return torch.cat([self.embed(x.head), x.tail @ self.w1])
        return spmm(x, self.w1) if isinstance(x, CSRPair) else x @ self.w1

    def forward(self, x: Tensor | CSRPair | RowBlocks, adj: CSRPair, cross: tuple[Tensor, Tensor] | None = None,
                gen: torch.Generator | None = None) -> Tensor:
        """``[n_c, F] -> [n_c, classes]`` logits; ``cross`` is ``(C1, C2)`` above or None;
        ``gen`` draws the dropout mask (training mode)."""
        h = spmm(adj, self.embed(x))  # no input dropout, as FederatedScope-GNN's GCN
        if cross is not None:
            h = h + cross[0]
        h = F.relu(h + self.b1)
        # from the client's own generator, so that no global seed orders the clients' draws
        h = inverted_dropout(h, self.dropout, self.training, generator=gen)
        out = spmm(adj, h @ self.w2) + self.b2
        return out + cross[1] if cross is not None else out


def flat_params(model: nn.Module) -> Tensor:
    """All parameters as one ``[d]`` vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def load_flat(model: nn.Module, flat: Tensor) -> None:
    """Write a ``[d]`` vector back into the parameters, in ``parameters()`` order."""
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[off: off + p.numel()].view_as(p))
            off += p.numel()
