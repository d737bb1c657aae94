"""The single-process reference: the same architecture from PyG's own layers.

Used by the parity tests and the benchmarks as the ground truth. Parameter names equal
those of :class:`commgnn.models.net.PartitionGNN`, so one state dict fits both.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.models.config import ModelConfig
from commgnn.models.net import activation, layer_specs


class ReferenceGNN(nn.Module):
    """The same architecture from PyG's ``GCNConv`` / ``SAGEConv`` / ``GATConv`` (one process)."""

    def __init__(self, cfg: ModelConfig, in_dim: int, num_classes: int) -> None:
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv

        super().__init__()
        self.cfg = cfg
        self.convs = nn.ModuleList()
        for d_in, d_out, heads, concat in layer_specs(cfg, in_dim, num_classes):
            if cfg.name == "gcn":
                self.convs.append(GCNConv(d_in, d_out))
            elif cfg.name == "sage":
                self.convs.append(SAGEConv(d_in, d_out, aggr="mean"))
            else:
                self.convs.append(GATConv(d_in, d_out, heads=heads, concat=concat, dropout=cfg.attn_dropout))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = x
        for i, conv in enumerate(self.convs):
            h = F.dropout(h, p=self.cfg.dropout, training=self.training)
            h = conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = activation(self.cfg, h)
        return h
