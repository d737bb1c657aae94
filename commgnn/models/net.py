"""The partition-parallel GNN: L layers, one halo exchange before each aggregation.

For layer l on rank r (``n_own`` owned rows, ``n_halo`` halo rows)::

    h      = dropout(h)                          # [n_own, d_l], the owner draws the mask
    h_src  = cat(h, halo.exchange(h, l))         # [n_own + n_halo, d_l]
    h      = act(conv_l(h_src, graph))           # [n_own, d_{l+1}]  (no act after the last)

:func:`reference_model` builds the same architecture from PyG's own layers for a single
process on the whole graph; the parameter names agree, so one state dict fits both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.comm.halo import HaloExchange
from commgnn.models.config import ModelConfig
from commgnn.models.gat import GATLayer
from commgnn.models.gcn import GCNLayer
from commgnn.models.graph import LocalGraph
from commgnn.models.sage import SAGELayer


def layer_dims(cfg: ModelConfig, in_dim: int, num_classes: int) -> list[tuple[int, int]]:
    """``(d_in, d_out)`` of each layer."""
    dims = [in_dim] + [cfg.hidden] * (cfg.layers - 1) + [num_classes]
    return list(zip(dims[:-1], dims[1:]))


def _activation(cfg: ModelConfig, h: Tensor) -> Tensor:
    return F.elu(h) if cfg.name == "gat" else F.relu(h)


class PartitionGNN(nn.Module):
    """GCN / GraphSAGE / GAT over a rank's partition plus its halo."""

    def __init__(self, cfg: ModelConfig, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.convs = nn.ModuleList()
        dims = layer_dims(cfg, in_dim, num_classes)
        for i, (d_in, d_out) in enumerate(dims):
            last = i == len(dims) - 1
            if cfg.name == "gcn":
                self.convs.append(GCNLayer(d_in, d_out))
            elif cfg.name == "sage":
                self.convs.append(SAGELayer(d_in, d_out))
            else:
                heads = 1 if last else cfg.heads
                self.convs.append(GATLayer(d_in, d_out // heads if not last else d_out, heads,
                                           concat=not last, attn_dropout=cfg.attn_dropout))

    def forward(self, x: Tensor, graph: LocalGraph, halo: HaloExchange) -> Tensor:
        h = x
        for i, conv in enumerate(self.convs):
            h = F.dropout(h, p=self.cfg.dropout, training=self.training)
            halo_rows = halo.exchange(h, i)
            h_src = torch.cat([h, halo_rows]) if halo_rows.shape[0] else h
            h = conv(h_src, graph)
            if i < len(self.convs) - 1:
                h = _activation(self.cfg, h)
        return h


class ReferenceGNN(nn.Module):
    """The same architecture from PyG's ``GCNConv`` / ``SAGEConv`` / ``GATConv`` (one process)."""

    def __init__(self, cfg: ModelConfig, in_dim: int, num_classes: int) -> None:
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv

        super().__init__()
        self.cfg = cfg
        self.convs = nn.ModuleList()
        dims = layer_dims(cfg, in_dim, num_classes)
        for i, (d_in, d_out) in enumerate(dims):
            last = i == len(dims) - 1
            if cfg.name == "gcn":
                self.convs.append(GCNConv(d_in, d_out))
            elif cfg.name == "sage":
                self.convs.append(SAGEConv(d_in, d_out, aggr="mean"))
            else:
                heads = 1 if last else cfg.heads
                self.convs.append(GATConv(d_in, d_out if last else d_out // heads, heads=heads,
                                          concat=not last, dropout=cfg.attn_dropout))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = x
        for i, conv in enumerate(self.convs):
            h = F.dropout(h, p=self.cfg.dropout, training=self.training)
            h = conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = _activation(self.cfg, h)
        return h
