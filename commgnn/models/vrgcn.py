"""VR-GCN's forward pass over a :class:`~commgnn.sampling.vrgcn.VRBatch`, and its history.

With ``hbar_l: [N, d_l]`` the history of layer l's input (l >= 1) on this rank::

    h_1     = act(W_l pre[:n] + b_l + W_r x[:n])                 layer 0: exact, precomputed
    delta   = dropout(h_l) - hbar_l[nodes]                       [num_src_l, d_l]
    agg     = A_sample delta + A_full hbar_l[all in-neighbours]  [num_dst_l, d_l]
    h_{l+1} = act(W_l agg + b_l + W_r dropout(h_l)[:num_dst_l])
    hbar_l[nodes[:num_src_l]] <- h_l   (after the step, detached)

``A_sample`` holds ``1/k`` per sampled edge (the block's weights), ``A_full`` ``1/d_v``;
the history term carries no gradient (hbar is a constant), as in the paper. Each rank
keeps the history of every node it computes (its own and remote ones); rows it never
computed are 0, which only weakens the control variate until they are first computed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.models.blocks import BlockGraph
from commgnn.models.graph import spmm
from commgnn.models.net import PartitionGNN, activation
from commgnn.sampling.vrgcn import VRBatch


class History:
    """``hbar_l`` for l = 1 .. L-1: ``[N, d_l]`` tables."""

    def __init__(self, num_nodes: int, widths: list[int], dtype: torch.dtype) -> None:
        self.tables = [torch.zeros(num_nodes, w, dtype=dtype) for w in widths]

    def __getitem__(self, layer: int) -> Tensor:
        return self.tables[layer - 1]

    def state_dict(self) -> dict[str, Any]:
        return {"tables": [t.clone() for t in self.tables]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for t, s in zip(self.tables, state["tables"]):
            t.copy_(s)


class VRGCN(nn.Module):
    """``forward(rows, batch)``: rows are ``[n0, 2F]`` = ``[x | mean_N x]`` of ``batch.nodes``."""

    def __init__(self, model: PartitionGNN, history: History) -> None:
        super().__init__()
        self.gnn = model
        self.history = history

    def forward(self, rows: Tensor, batch: VRBatch) -> Tensor:
        gnn = self.gnn
        p, training = gnn.cfg.dropout, self.training
        half = rows.shape[1] // 2
        x, pre = rows[:, :half], rows[:, half:]
        n1 = batch.blocks[0].num_dst
        h = gnn.convs[0].from_precomputed(F.dropout(pre[:n1], p, training), F.dropout(x[:n1], p, training), None)
        last = len(gnn.convs) - 1
        if last > 0:
            h = activation(gnn.cfg, h)
        updates: list[tuple[Tensor, Tensor, Tensor]] = []
        for i in range(1, last + 1):
            conv, block, full = gnn.convs[i], batch.blocks[i], batch.history_edges[i]
            assert full is not None
            table = self.history[i]
            ids = batch.nodes[: block.num_src]
            hd = F.dropout(h, p, training)
            with torch.no_grad():  # the history term is a constant: no gradient
                hist_msg = conv.message(table[full.src].to(h.dtype))
                agg_full = torch.zeros(block.num_dst, hist_msg.shape[1], dtype=h.dtype)
                agg_full.index_add_(0, full.dst, hist_msg * full.weight.to(h.dtype)[:, None])
                old = table[ids].to(h.dtype)
            delta = conv.message(hd) - conv.message(old)  # the sampled term uses the history before this step
            sampled = spmm(BlockGraph(block).mean_adj(h.dtype), delta)
            updates.append((table, ids, h.detach()))
            h = _sage_out(conv, sampled + agg_full, hd[: block.num_dst])
            if i < last:
                h = activation(gnn.cfg, h)
        if training:
            for table, ids, value in updates:  # hbar_i <- h_i for the rows this step computed
                table[ids] = value.to(table.dtype)
        return h


def _sage_out(conv: nn.Module, agg: Tensor, h_dst: Tensor) -> Tensor:
    """``W_l agg + b_l + W_r h_dst`` with ``agg`` already in message space (``W_l`` applied
    first when the layer transforms first)."""
    out = agg + conv.lin_l.bias if conv.transform_first else conv.lin_l(agg)
    return out + conv.lin_r(h_dst)
