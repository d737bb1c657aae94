"""The partition model's layers run on sampled mini-batches (blocks).

The mini-batch trainer keeps one :class:`~commgnn.models.net.PartitionGNN` (so exact
full-graph evaluation, checkpoints and ``model.pt`` are those of full-graph training) and
runs its layers over a batch's blocks (:mod:`commgnn.sampling.base`)::

    h_0 = x[nodes]                                         [num_src_0, F]
    h   = dropout(h_l)
    m   = conv_l.message(h)                                h, or h W_l^T when narrower
    h_{l+1} = act(conv_l.combine(m, h[:num_dst_l], block_l))    [num_dst_l, d_{l+1}]

``combine`` aggregates with the block's weighted adjacency ``A_l: [num_dst, num_src]``
(``A[i, j] = weight`` of edge j -> i) through the same CSR kernel as full-graph training.
Only GraphSAGE (mean) is a sampled model here: its aggregation is a weighted mean, which
every sampler's weights estimate; GCN's and GAT's normalisations are not.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from commgnn.models.dropout import dropout
from commgnn.models.graph import CSRPair, spmm
from commgnn.models.net import PartitionGNN
from commgnn.models.sparse import SparseRows
from commgnn.sampling.base import Block, MiniBatch

SAMPLED_MODELS = ("sage",)
"""Model names the samplers fit."""


class BlockGraph:
    """A block seen as the ``graph`` argument of a layer's ``combine``."""

    def __init__(self, block: Block, kernel: str = "torch") -> None:
        """``kernel``: the SpMM that runs its products (:data:`commgnn.models.graph.KERNELS`)."""
        self.block = block
        self.kernel = kernel
        self._pair: dict[torch.dtype, CSRPair] = {}

    def mean_adj(self, dtype: torch.dtype) -> CSRPair:
        """The block's weighted adjacency ``[num_dst, num_src]`` and its transpose."""
        if dtype not in self._pair:
            b = self.block
            src, dst = b.edge_index
            self._pair[dtype] = CSRPair.build(dst, src, b.weight.to(dtype), (b.num_dst, b.num_src), self.kernel)
        return self._pair[dtype]


def _sparse_first_layer(conv: nn.Module, x: Tensor, block: Block, graph: BlockGraph, p: float,
                        training: bool) -> Tensor:
    """GraphSAGE on a mostly-zero input, computed on its non-zeros (:mod:`commgnn.models.sparse`)::

        v   = dropout(values of x at its pattern)      one mask per entry, as dense dropout
        out = A (X_v W_l^T) + b_l + X_v[:num_dst] W_r^T

    (``A`` is linear, so transforming before aggregating is exact.) The destination rows
    are a prefix of the sources, so their values are a prefix of ``v``: same mask."""
    pattern = SparseRows(x)
    values = dropout(pattern.gather(x), p, training)
    own = pattern.head(block.num_dst)
    m = pattern.linear(values, conv.lin_l.weight)
    out = spmm(graph.mean_adj(m.dtype), m) + conv.lin_l.bias
    return out + own.linear(values[: own.rows.numel()], conv.lin_r.weight)


class BlockGNN(nn.Module):
    """``model``'s layers over a batch: ``forward(x_rows, batch) -> [num_dst_last, C]``.
    A module of its own so that DDP-based gradient strategies can wrap it; its parameters
    are the partition model's."""

    def __init__(self, model: PartitionGNN, *, sparse_input: bool = False) -> None:
        """``sparse_input``: the features are mostly zeros; the first layer then computes on
        their non-zeros (:mod:`commgnn.models.sparse`)."""
        super().__init__()
        self.gnn = model
        self.sparse_input = sparse_input

    def forward(self, x: Tensor, batch: MiniBatch, graphs: list[BlockGraph] | None = None) -> Tensor:
        gnn = self.gnn
        graphs = graphs if graphs is not None else [BlockGraph(b) for b in batch.blocks]
        h = x
        last = len(gnn.convs) - 1
        for i, (conv, block, graph) in enumerate(zip(gnn.convs, batch.blocks, graphs)):
            if i == 0 and self.sparse_input:
                h = _sparse_first_layer(conv, h, block, graph, gnn.cfg.dropout, self.training)
            else:
                h = dropout(h, p=gnn.cfg.dropout, training=self.training)
                h = conv.combine(conv.message(h), h[: block.num_dst], graph)
            if i < last:
                h = gnn.post(i, h)
        return h
