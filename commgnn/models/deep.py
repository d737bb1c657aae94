"""Deep residual GNNs: DeeperGCN's ResGCN+ (pre-activation residual blocks) over a partition.

Li et al., "DeeperGCN: All You Need to Train Deeper GCNs" (2020), block ``res+``. On rank r
with ``n_own`` owned rows, ``n_halo`` halo rows, width ``d = hidden`` and ``L = layers``::

    h_0     = x W_enc^T + b_enc                                   x: [n_own, F] -> [n_own, d]
    for l = 0 .. L-1:                                             (block l, one halo exchange)
        m_l     = dropout(act(LayerNorm_l(h_l)))                  [n_own, d], the owner draws the mask
        m_src   = cat(m_l, halo.exchange(m_l, l))                 [n_own + n_halo, d]
        h_{l+1} = h_l + conv_l.combine(m_src, m_l, graph)         [n_own, d]  (GCN or SAGE, d -> d)
    logits  = dropout(act(LayerNorm_out(h_L))) W_dec^T + b_dec    [n_own, C]

``layers`` counts the graph convolutions, so a model with ``layers = L`` makes exactly L
halo exchanges forward (and L backward), layer indices 0..L-1 as the meter counts them; the
encoder and decoder are row-local. Every message is ``d`` wide, whatever the input width.

Checkpointing (``cfg.checkpoint``) wraps each block's residual branch in
``torch.utils.checkpoint`` (non-reentrant): the block keeps its input ``h_l`` and the halo
rows it received, and the backward pass recomputes the rest from them. The recomputation
must not exchange again (a second collective, extra bytes, and levers with state such as
skip or pipeline would see the layer twice), so each block's exchange is wrapped in
:class:`_ExchangeOnce`, which hands the recomputation the rows of the first call. Dropout
masks are replayed by the checkpoint's saved RNG state; GCN and SAGE draw nothing after
the exchange, so the recomputed block equals the original.

:class:`commgnn.models.reference.ReferenceGNN` builds the same model from PyG's layers for
one process; parameter names agree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from commgnn.comm.halo.protocol import HaloExchange
from commgnn.errors import ConfigError
from commgnn.models.config import ModelConfig
from commgnn.models.dropout import dropout
from commgnn.models.gcn import GCNLayer
from commgnn.models.graph import LocalGraph
from commgnn.models.net import activation
from commgnn.models.sage import SAGELayer
from commgnn.models.sparse import SparseProj, SparseRows


PRECOMPUTE_REFUSED = ("comm.halo.precompute aggregates the constant input once, but res+ blocks aggregate the "
                      "learned encoding (the input never travels): drop precompute")
"""The one-line refusal of ``precompute`` with ``residual = "res+"``."""
MINIBATCH_REFUSED = ("model.residual = 'res+' trains full-graph only (mini-batch training runs the plain layer "
                     "stack): set train.mode = 'fullgraph' or model.residual = 'none'")
"""The one-line refusal of mini-batch training with ``residual = "res+"``."""


class _ExchangeOnce:
    """One block's exchange for one forward pass: the first call exchanges, a later call
    (the checkpoint's recomputation in the backward pass) returns the same rows."""

    def __init__(self, halo: HaloExchange) -> None:
        self.halo = halo
        self.rows: Tensor | None = None

    def exchange(self, h: Tensor, layer: int) -> Tensor:
        if self.rows is None:
            self.rows = self.halo.exchange(h, layer)
        return self.rows


class ResPlusGNN(nn.Module):
    """ResGCN+ / ResSAGE+ over a rank's partition plus its halo (see the module docstring).

    Parameters: ``encoder`` (Linear F -> d), ``norms.{l}`` (LayerNorm d), ``convs.{l}``
    (:class:`GCNLayer` / :class:`SAGELayer` d -> d, PyG's names), ``out_norm`` (LayerNorm d)
    and ``decoder`` (Linear d -> C). The interface is :class:`~commgnn.models.net.PartitionGNN`'s.
    """

    def __init__(self, cfg: ModelConfig, in_dim: int, num_classes: int, *,
                 transform_first: bool = False) -> None:
        """``transform_first`` is accepted for the trainer's sake and changes nothing: every
        convolution maps d -> d, so no product is narrower than its input."""
        super().__init__()
        if cfg.residual != "res+" or cfg.name not in ("gcn", "sage"):
            raise ConfigError(f"ResPlusGNN builds model.residual = 'res+' with gcn or sage, got residual = "
                              f"{cfg.residual!r}, name = {cfg.name!r}")
        self.cfg = cfg
        d = cfg.hidden
        self.encoder = nn.Linear(in_dim, d)
        layer = GCNLayer if cfg.name == "gcn" else SAGELayer
        self.convs = nn.ModuleList(layer(d, d, transform_first) for _ in range(cfg.layers))
        # LayerNorm normalises each row on its own, so a rank needs nothing from its peers.
        # BatchNorm's statistics run over all nodes: exact would cost a synced all-reduce of
        # mean and variance per layer, forward and backward, and would tie the model to P.
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(cfg.layers))
        self.out_norm = nn.LayerNorm(d)
        self.decoder = nn.Linear(d, num_classes)
        self.sparse: SparseRows | None = None

    def precompute(self, x: Tensor, graph: LocalGraph, halo: HaloExchange, *, dropout: str = "aggregate") -> None:
        """Refused: the first convolution aggregates the learned encoding, not the constant input."""
        raise ConfigError(PRECOMPUTE_REFUSED)

    @torch.no_grad()
    def use_sparse_input(self, x: Tensor, halo: HaloExchange) -> None:
        """Run the encoder on the input's non-zero pattern (:mod:`commgnn.models.sparse`).
        The input never travels, so no exchange is needed (``halo`` is unused)."""
        self.sparse = SparseRows(x)

    def _encode(self, x: Tensor) -> Tensor:
        """``[n_own, F] -> [n_own, d]``; the input has no dropout (DeeperGCN's encoder)."""
        if self.sparse is not None:
            return SparseProj(self.sparse)(x, self.encoder.weight) + self.encoder.bias
        return self.encoder(x)

    def _branch(self, h: Tensor, i: int, graph: LocalGraph,
                halo: HaloExchange | _ExchangeOnce | _StandInHalo) -> Tensor:
        """Block ``i``'s residual branch ``conv_i(dropout(act(norm_i(h))))``: ``[n_own, d] -> [n_own, d]``."""
        m = dropout(activation(self.cfg, self.norms[i](h)), p=self.cfg.dropout, training=self.training)
        conv = self.convs[i]
        msg = conv.message(m)
        # Always through the exchange's output, even with no halo rows here: its backward is
        # a collective that every rank must enter.
        return conv.combine(torch.cat([msg, halo.exchange(msg, i)]), m, graph)

    def forward(self, x: Tensor, graph: LocalGraph, halo: HaloExchange, *, upto: int | None = None) -> Tensor:
        """Logits ``[n_own, C]``; with ``upto = k``, the residual stream ``h_{k+1}`` after
        block k (0-based), ``[n_own, d]``, instead: node embeddings."""
        h = self._encode(x)
        recompute = self.cfg.checkpoint and torch.is_grad_enabled()
        for i in range(len(self.convs)):
            if recompute:
                h = h + checkpoint(self._branch, h, i, graph, _ExchangeOnce(halo), use_reentrant=False)
            else:
                h = h + self._branch(h, i, graph, halo)
            if i == upto:
                return h
        h = dropout(activation(self.cfg, self.out_norm(h)), p=self.cfg.dropout, training=self.training)
        return self.decoder(h)

    @staticmethod
    def saved_bytes_per_block(cfg: ModelConfig, n_own: int, n_halo: int, *, dtype: torch.dtype = torch.float32,
                              degree: int = 8) -> int:
        """Bytes one block keeps for the backward pass on a rank with ``n_own`` owned and
        ``n_halo`` halo rows (weights not counted).

        Without checkpointing this is measured, not modelled: one block of ``cfg`` runs a
        training forward on a random graph of that size (``degree`` in-edges per owned row,
        a stand-in exchange that saves nothing, as the real one) under
        ``torch.autograd.graph.saved_tensors_hooks``, and the distinct storages autograd
        keeps are summed. On CPU with ReLU, dropout and GCN that is LayerNorm's input and
        per-row statistics, ReLU's output, dropout's bool mask (:mod:`commgnn.models.dropout`)
        and the convolution's operand, about ``3.25 n_own d`` values. With checkpointing the
        block keeps its input and its received halo rows, ``(n_own + n_halo) d`` values
        (:class:`_ExchangeOnce`), plus, during the backward pass, one block's worth of the
        former while that block is recomputed.
        """
        d, b = cfg.hidden, torch.empty(0, dtype=dtype).element_size()
        if cfg.checkpoint:
            return b * (n_own + n_halo) * d
        gen = torch.Generator().manual_seed(0)
        n_src, edges = n_own + n_halo, degree * n_own
        graph = LocalGraph(num_own=n_own, num_src=n_src,
                           edge_index=torch.stack([torch.randint(0, n_src, (edges,), generator=gen),
                                                   torch.randint(0, n_own, (edges,), generator=gen)]),
                           in_degree=torch.full((n_src,), degree))
        block = ResPlusGNN(replace(cfg, layers=1), 1, 1).to(dtype).train()
        weights = {w.untyped_storage().data_ptr() for w in block.parameters()}
        kept: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                kept[storage.data_ptr()] = storage.nbytes()
            return t

        h = torch.randn(n_own, d, dtype=dtype, generator=gen, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block._branch(h, 0, graph, _StandInHalo(n_halo))
        return sum(kept.values())


class _ZeroRowsFn(torch.autograd.Function):
    """``[n_own, d] -> [n, d]`` fresh rows, differentiable, saving nothing: the real
    exchange's footprint, for :meth:`ResPlusGNN.saved_bytes_per_block`."""

    @staticmethod
    def forward(fctx: Any, h: Tensor, n: int) -> Tensor:  # type: ignore[override]
        fctx.shape = h.shape
        return h.new_zeros((n, h.shape[1]))

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad.new_zeros(fctx.shape), None


class _StandInHalo:
    """An exchange that returns ``n`` halo rows without communicating."""

    def __init__(self, n: int) -> None:
        self.n = n

    def exchange(self, h: Tensor, layer: int, kind: str | None = None) -> Tensor:
        return _ZeroRowsFn.apply(h, self.n)
