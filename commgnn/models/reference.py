"""The single-process reference: the same architecture from PyG's own layers.

Used by the parity tests and the benchmarks as the ground truth. Parameter names equal
those of :class:`commgnn.models.net.PartitionGNN` (``residual = "none"``) and of
:class:`commgnn.models.deep.ResPlusGNN` (``residual = "res+"``), so one state dict fits both.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.models.config import ModelConfig
from commgnn.models.net import activation, hidden_norms, layer_specs, post_layer


class ReferenceGNN(nn.Module):
    """The same architecture from PyG's ``GCNConv`` / ``SAGEConv`` / ``GATConv`` (one process).

    ``residual = "none"``: ``layers`` convolutions with the activation between them.
    ``residual = "res+"``: DeeperGCN's pre-activation blocks around ``hidden -> hidden``
    convolutions (what PyG's ``DeepGCNLayer(block="res+")`` computes, with this project's
    parameter names)::

        h = encoder(x)                                              [N, F] -> [N, d]
        h = h + conv_l(dropout(act(norm_l(h))), edge_index)         l = 0 .. L-1
        logits = decoder(dropout(act(out_norm(h))))                 [N, d] -> [N, C]

    ``model.checkpoint`` changes memory, not the function, and is not applied here.
    """

    def __init__(self, cfg: ModelConfig, in_dim: int, num_classes: int) -> None:
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv

        super().__init__()
        self.cfg = cfg
        if cfg.residual == "res+":  # modules in ResPlusGNN's order, so parameters() lines up too
            d = cfg.hidden
            self.encoder = nn.Linear(in_dim, d)
            self.convs = nn.ModuleList(GCNConv(d, d) if cfg.name == "gcn" else SAGEConv(d, d, aggr="mean")
                                       for _ in range(cfg.layers))
            self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(cfg.layers))
            self.out_norm = nn.LayerNorm(d)
            self.decoder = nn.Linear(d, num_classes)
            return
        self.convs = nn.ModuleList()
        for d_in, d_out, heads, concat in layer_specs(cfg, in_dim, num_classes):
            if cfg.name == "gcn":
                self.convs.append(GCNConv(d_in, d_out))
            elif cfg.name == "sage":
                self.convs.append(SAGEConv(d_in, d_out, aggr="mean"))
            else:
                self.convs.append(GATConv(d_in, d_out, heads=heads, concat=concat, dropout=cfg.attn_dropout))
        self.norms = hidden_norms(cfg, in_dim, num_classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Logits ``[N, C]`` of every node."""
        p = self.cfg.dropout
        if self.cfg.residual == "res+":
            h = self.encoder(x)
            for conv, norm in zip(self.convs, self.norms):
                h = h + conv(F.dropout(activation(self.cfg, norm(h)), p=p, training=self.training), edge_index)
            return self.decoder(F.dropout(activation(self.cfg, self.out_norm(h)), p=p, training=self.training))
        h = x
        for i, conv in enumerate(self.convs):
            h = F.dropout(h, p=p, training=self.training)
            h = conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = post_layer(self, i, h)
        return h
