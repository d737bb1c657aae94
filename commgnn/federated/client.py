"""A federated client: its subgraph, its local training and its share of the cross-client
embeddings.

One client holds ``ClientData`` (``n_c`` nodes, local edges, the edges arriving from other
clients). Per round it receives the global parameters ``w`` (``[d]``), takes
``local_epochs`` full-batch SGD steps on its training nodes, and returns the update
``w_local - w``. FedProx adds ``mu/2 ||w_local - w||^2`` to the local loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from commgnn.comm import quant
from commgnn.federated.config import FedConfig
from commgnn.federated.model import FedGCN, RowBlocks, feature_operator, flat_params, gcn_operator, load_flat
from commgnn.federated.neighgen import Generated
from commgnn.federated.client_data import ClientData
from commgnn.models.graph import CSRPair, spmm


class Client:
    """One organisation's data and local training (stateless between rounds, except for
    the uplink codec's error-feedback residual, which the engine keeps)."""

    def __init__(self, data: ClientData, cfg: FedConfig, *, global_degree: Tensor | None,
                 generated: Generated | None = None) -> None:
        self.data, self.cfg = data, cfg
        # Mended subgraphs (neighgen) append generated neighbours after the real nodes: they
        # enter the aggregation, never the loss or the predictions.
        self.num_real = data.num_nodes
        edge_index, extra = data.edge_index, 0
        if generated is not None and generated.num_nodes:
            edge_index, extra = torch.cat([edge_index, generated.edge_index], 1), generated.num_nodes
        n = data.num_nodes + extra
        own_degree = torch.bincount(edge_index[1], minlength=n)
        # With embeddings crossing, normalise by whole-graph degrees (module docstring of model.py).
        self.degree = global_degree[data.nodes] if global_degree is not None else own_degree
        self.adj = gcn_operator(edge_index, n, self.degree)
        self.dinv = (self.degree.to(torch.float32) + 1).pow(-0.5)
        self.num_train = int(data.train_mask.sum())
        # Bag-of-words features are mostly zeros (CS: ~1%): X W1 as a sparse product costs
        # nnz(X) h instead of n F h, forward and backward (W1's gradient is X^T G).
        self.x_op: Tensor | CSRPair | RowBlocks = feature_operator(data.x)
        if extra:  # generated rows are dense: a block of their own keeps the real rows' product sparse
            self.x_op = RowBlocks(self.x_op, generated.x)  # type: ignore[union-attr]

    # ---------------------------------------------------------------- cross-client rows
    def layer_rows(self, model: FedGCN, ids: Tensor, layer: int, cross1: Tensor | None = None) -> Tensor:
        """What this client's nodes ``ids`` contribute to a neighbour elsewhere, before
        protection: ``d_u^-1/2 x_u W1`` (layer 1) or ``d_u^-1/2 h_u W2`` with ``h`` this
        client's first-layer output under its own cross term ``cross1`` (layer 2): ``[k, w]``."""
        with torch.no_grad():
            if layer == 1:
                return self.dinv[ids, None] * model.embed(self.data.x[ids])
            h = F.relu(spmm(self.adj, model.embed(self.x_op)) + (cross1 if cross1 is not None else 0.0) + model.b1)
            return self.dinv[ids, None] * (h[ids] @ model.w2)

    @staticmethod
    def protect(rows: Tensor, *, bits: int, noise: float, gen: torch.Generator) -> tuple[Tensor, int]:
        """Noise, then b-bit codes: the rows as the receiver decodes them, and the bytes that cross."""
        if noise > 0:
            rows = rows + noise * torch.randn(rows.shape, generator=gen)
        if bits == 32:
            return rows, rows.numel() * 4
        codes = quant.encode(rows, bits, gen)
        return quant.decode(codes, bits, rows.shape[1], rows.dtype), codes.numel()

    def cross_term(self, incoming: dict[int, tuple[Tensor, Tensor]], width: int) -> Tensor:
        """``C = sum over cross edges u -> v of d_v^-1/2 s_u``: ``[n_c, width]``. ``incoming``
        maps a source client to (its local row ids, the rows ``[k, width]``)."""
        d = self.data
        out = torch.zeros(d.num_nodes, width)
        for src_client, (ids, rows) in incoming.items():
            sel = d.cross_src_client == src_client
            # position of each edge's source among the rows that client sent (ids is sorted)
            pos = torch.searchsorted(ids, d.cross_src_local[sel])
            dst = d.cross_edges[1, sel]
            out.index_add_(0, dst, self.dinv[dst, None] * rows[pos])
        return out

    def needs_from(self) -> dict[int, Tensor]:
        """Source client -> the sorted local ids (in that client) of the rows this one needs."""
        d = self.data
        return {int(c): torch.unique(d.cross_src_local[d.cross_src_client == c])
                for c in torch.unique(d.cross_src_client)}

    # ---------------------------------------------------------------- training
    def train(self, model: FedGCN, start: Tensor, *, cross: tuple[Tensor, Tensor] | None,
              gen: torch.Generator) -> tuple[Tensor, float]:
        """Local steps from the parameters ``start`` (``[d]``); returns ``(w_local - start, last loss)``."""
        cfg, d = self.cfg, self.data
        load_flat(model, start)
        if self.num_train == 0:
            return torch.zeros_like(start), 0.0
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        anchor = [p.detach().clone() for p in model.parameters()] if cfg.algorithm == "fedprox" else None
        model.train()
        loss = torch.zeros(())
        for _ in range(cfg.local_epochs):
            opt.zero_grad()
            logits = model(self.x_op, self.adj, cross, gen)[: self.num_real]  # dropout masks from gen
            loss = F.cross_entropy(logits[d.train_mask], d.y[d.train_mask])
            if anchor is not None:
                loss = loss + 0.5 * cfg.mu * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
            loss.backward()
            opt.step()
        return flat_params(model) - start, float(loss.detach())

    def predict(self, model: FedGCN, params: Tensor, cross: tuple[Tensor, Tensor] | None) -> Tensor:
        """Predicted class of each of the client's nodes under ``params``: ``[n_c]``."""
        load_flat(model, params)
        model.eval()
        with torch.no_grad():
            return model(self.x_op, self.adj, cross).argmax(1)[: self.num_real]
