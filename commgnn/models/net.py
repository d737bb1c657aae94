"""The partition-parallel GNN: L layers, one halo exchange before each aggregation.

For layer l on rank r (``n_own`` owned rows, ``n_halo`` halo rows)::

    h      = dropout(h)                                   # [n_own, d_l], the owner draws the mask
    m      = conv_l.message(h)                            # h, or h W^T when narrower (transform first)
    m_src  = cat(m, halo.exchange(m, l))                  # [n_own + n_halo, d_msg]
    h      = act(norm_l(conv_l.combine(m_src, h, graph))) # [n_own, d_{l+1}]  (neither after the last)

``norm_l`` is the identity, or with ``model.norm = "layer"`` a LayerNorm of each row.

With ``precompute`` the first layer's aggregation of the constant input is computed once
(:meth:`PartitionGNN.precompute`, one exchange before training) and input dropout acts on
the aggregate (``"aggregate"``), or as noise matched per entry to the exact model's
``A dropout(X)`` (``"matched"``, :func:`commgnn.models.sparse.matched_dropout`).
:class:`commgnn.models.reference.ReferenceGNN` is the same architecture
from PyG's own layers for one process on the whole graph; the parameter names agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from commgnn.comm.halo.protocol import HaloExchange
from commgnn.errors import ConfigError
from commgnn.models.config import ModelConfig
from commgnn.models.dropout import dropout, dropout_projector
from commgnn.models.gat import GATLayer
from commgnn.models.gcn import GCNLayer
from commgnn.models.graph import LocalGraph, spmm
from commgnn.models.maxk import maxk
from commgnn.models.sage import SAGELayer
from commgnn.models.sparse import SparseProj, SparseRows, dense_proj, matched_dropout


def layer_dims(cfg: ModelConfig, in_dim: int, num_classes: int) -> list[tuple[int, int]]:
    """``(d_in, d_out)`` of each layer."""
    dims = [in_dim] + [cfg.hidden] * (cfg.layers - 1) + [num_classes]
    return list(zip(dims[:-1], dims[1:]))


def layer_specs(cfg: ModelConfig, in_dim: int, num_classes: int) -> list[tuple[int, int, int, bool]]:
    """``(d_in, channels per head, heads, concat)`` of each layer (heads = 1 except GAT's
    hidden layers, which concatenate ``cfg.heads`` heads of ``hidden / heads`` channels)."""
    specs = []
    dims = layer_dims(cfg, in_dim, num_classes)
    for i, (d_in, d_out) in enumerate(dims):
        hidden_gat = cfg.name == "gat" and i < len(dims) - 1
        heads = cfg.heads if hidden_gat else 1
        specs.append((d_in, d_out // heads, heads, hidden_gat))
    return specs


def activation(cfg: ModelConfig, h: Tensor) -> Tensor:
    act = cfg.act
    if act == "maxk":
        return maxk(h, cfg.maxk_k)
    return F.elu(h) if act == "elu" else F.relu(h)


def hidden_norms(cfg: ModelConfig, in_dim: int, num_classes: int) -> nn.ModuleList:
    """One ``LayerNorm`` per hidden layer's output (``model.norm = "layer"``), else none."""
    if cfg.norm != "layer":
        return nn.ModuleList()
    return nn.ModuleList(nn.LayerNorm(d_out) for _, d_out in layer_dims(cfg, in_dim, num_classes)[:-1])


def post_layer(model: nn.Module, i: int, h: Tensor) -> Tensor:
    """``act(norm_i(h))`` after hidden layer ``i`` of a plain stack (its ``cfg`` and ``norms``)."""
    norms = model.norms
    return activation(model.cfg, norms[i](h) if len(norms) else h)


def maxk_message_layers(cfg: ModelConfig, in_dim: int, num_classes: int, transform_first: bool) -> set[int]:
    """Layers whose halo message is a MaxK output (hence k-sparse): every layer after the
    first, unless transform-first sends its narrower product instead (GAT always does).
    In a res+ model every block's message is ``dropout(maxk(norm(h)))``: all layers."""
    if cfg.act != "maxk" or cfg.name == "gat":
        return set()
    if cfg.residual == "res+":
        return set(range(cfg.layers))
    dims = layer_dims(cfg, in_dim, num_classes)
    return {i for i in range(1, len(dims)) if not (transform_first and dims[i][1] < dims[i][0])}


MATCHED_REFUSED_FOR_GAT = ("comm.halo.precompute_dropout = 'matched' is for GCN and SAGE: GAT's precompute keeps "
                           "the input rows, whose dropout is already exact; use 'aggregate'")
"""The one-line refusal of ``precompute_dropout = "matched"`` with GAT."""


class PartitionGNN(nn.Module):
    """GCN / GraphSAGE / GAT over a rank's partition plus its halo (``model.residual = "none"``;
    the res+ model is :class:`commgnn.models.deep.ResPlusGNN`)."""

    def __init__(self, cfg: ModelConfig, in_dim: int, num_classes: int, *,
                 transform_first: bool = False) -> None:
        if cfg.residual != "none":  # never build the plain stack for a residual config silently
            raise ConfigError(f"PartitionGNN is the plain stack; model.residual = {cfg.residual!r} is built by "
                              f"commgnn.models.deep.ResPlusGNN")
        super().__init__()
        self.cfg = cfg
        self.convs = nn.ModuleList()
        for d_in, d_out, heads, concat in layer_specs(cfg, in_dim, num_classes):
            if cfg.name == "gcn":
                self.convs.append(GCNLayer(d_in, d_out, transform_first))
            elif cfg.name == "sage":
                self.convs.append(SAGELayer(d_in, d_out, transform_first))
            else:
                self.convs.append(GATLayer(d_in, d_out, heads, concat=concat, attn_dropout=cfg.attn_dropout,
                                           transform_first=transform_first))
        self.norms = hidden_norms(cfg, in_dim, num_classes)
        self.pre: Tensor | None = None
        self.pre_sigma: Tensor | None = None
        """``"matched"`` precompute dropout: ``sqrt((A o A)(X o X))``, ``[n_own, d_in]``."""
        self.sparse: dict[str, SparseRows] = {}  # input patterns: "own", "src" or "pre"
        self.sparse_sigma: Tensor | None = None  # pre_sigma's values on the "pre" pattern

    def post(self, i: int, h: Tensor) -> Tensor:
        """What follows hidden layer ``i``'s convolution: ``act(norm_i(h))``, row by row."""
        return post_layer(self, i, h)

    @torch.no_grad()
    def precompute(self, x: Tensor, graph: LocalGraph, halo: HaloExchange, *,
                   dropout: str = "aggregate") -> None:
        """Exchange the constant input once and keep the first layer's aggregate of it.

        ``dropout`` (``comm.halo.precompute_dropout``): ``"aggregate"`` drops entries of the
        aggregate ``A X`` during training; ``"matched"`` also keeps ``sigma`` of
        :func:`matched_dropout`, one more product of the squared operator with the squared
        input, so the noise has the exact model's per-entry variance (GCN and SAGE; GAT keeps
        the input rows themselves, whose dropout is already the exact model's)."""
        x_src = torch.cat([x, halo.exchange(x, 0, kind="halo_setup")])
        conv = self.convs[0]
        self.pre = conv.precompute(x_src, graph)
        self.pre_sigma = None
        if dropout == "matched":
            if isinstance(conv, GATLayer):
                raise ConfigError(MATCHED_REFUSED_FOR_GAT)
            self.pre_sigma = spmm(conv.aggregation(graph, x_src.dtype).squared(), x_src.square()).sqrt()

    @torch.no_grad()
    def use_sparse_input(self, x: Tensor, halo: HaloExchange) -> None:
        """Run the first layer's linear maps on the input's non-zero pattern
        (:mod:`commgnn.models.sparse`); learning the halo rows' pattern costs one exchange."""
        self.sparse["own"] = SparseRows(x)
        if self.pre is not None:
            if self.pre_sigma is None:
                self.sparse["pre"] = SparseRows(self.pre)
            else:  # the union of both patterns (A X can cancel to 0 where sigma is not)
                self.sparse["pre"] = SparseRows(self.pre.abs() + self.pre_sigma)
                self.sparse_sigma = self.sparse["pre"].gather(self.pre_sigma)
                self.pre_sigma = None  # the forward reads the pattern's values only
        elif not self.convs[0].transform_first:
            self.sparse["src"] = SparseRows(torch.cat([x, halo.exchange(x, 0, kind="halo_setup")]))

    def forward(self, x: Tensor, graph: LocalGraph, halo: HaloExchange, *, upto: int | None = None) -> Tensor:
        """Logits ``[n_own, C]``; with ``upto = k``, the ``[n_own, d]`` output of layer k
        (0-based, after its activation) instead: node embeddings."""
        h = x
        p = self.cfg.dropout
        sp = self.sparse
        for i, conv in enumerate(self.convs):
            if i == 0 and self.pre is not None:
                if sp:  # dropout on the pattern's values: the same law as on dense rows
                    h = conv.from_precomputed(self.pre, x, graph,
                                              SparseProj(sp["pre"], p, self.training, sigma=self.sparse_sigma),
                                              SparseProj(sp["own"], p, self.training))
                else:
                    pre = (dropout(self.pre, p, self.training) if self.pre_sigma is None
                           else matched_dropout(self.pre, self.pre_sigma, p, self.training))
                    h = conv.from_precomputed(pre, dropout(x, p, self.training), graph)
            else:
                # `dropped` projects the dropout's output keeping only h and the mask for backward
                h, dropped = dropout_projector(h, p, self.training)
                own = SparseProj(sp["own"]) if i == 0 and sp else dropped
                src = SparseProj(sp["src"]) if i == 0 and "src" in sp else dense_proj
                m = conv.message(h, own)
                # Always through the exchange's output, even with no halo rows here: its
                # backward is a collective that every rank must enter.
                h = conv.combine(torch.cat([m, halo.exchange(m, i)]), h, graph, src, own)
            if i < len(self.convs) - 1:
                h = self.post(i, h)
            if i == upto:
                break
        return h
