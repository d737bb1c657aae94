"""Bring your own model: run a user's PyG model partition-parallel, unmodified.

A user writes an ordinary PyG model, ``forward(x, edge_index, *extra)``, from
``MessagePassing`` layers plus anything row-wise (activations, ``Linear``, dropout,
``nn.LayerNorm``, residual adds). :class:`DistributedModel` runs it on one rank's
partition: every tensor the user's code sees has the rank's ``n_own`` owned rows, and just
before each message-passing layer ``l`` (``l`` = position of the layer among the model's
top-level ``MessagePassing`` submodules in registration order) the halo exchange fetches
the boundary rows the layer needs from the other ranks::

    h      : [n_own, d]                              # what the user's code handed to conv_l
    h_src  = cat(h, halo.exchange(h, l))             # [n_src, d], n_src = n_own + n_halo
    out    = conv_l((h_src, h), edge_index_local)    # [n_own, d'], PyG's own forward, bipartite

``edge_index_local`` (``LocalGraph.edge_index``, ``[2, E_r]``) holds every global edge
whose target is owned here, sources in ``[0, n_src)`` (owned rows first, then halo rows),
targets in ``[0, n_own)``. Since a rank holds *all* in-edges of its owned nodes, any layer
whose output row ``i`` depends only on ``x_i`` and on ``{x_j, j -> i}`` gives exactly the
single-process result on owned rows (this is the approach of SAR, Intel Labs, which runs
unmodified DGL/PyG layers in distributed full-batch training). Per layer type:

* ``SAGEConv``, ``GraphConv``, ``GINConv``: ``out_i = f(x_i, AGG_{j->i} g(x_j))``; PyG
  accepts the pair ``(x_src, x_dst)`` natively; the root term uses ``x_dst = h``.
* ``GATConv``, ``GATv2Conv``, ``TransformerConv``: attention ``alpha_ij = softmax_{j in
  N(i)} e_ij`` is normalised over each target's in-edges, all local. PyG adds self loops for
  ``min(n_src, n_own) = n_own`` nodes, i.e. ``i -> i`` for owned ``i`` (owned rows come
  first in both numberings) after removing existing loops: the same as on the whole graph.
* ``GCNConv``: ``out = D^-1/2 (A + I) D^-1/2 (X W^T) + b`` needs the *global* degree of
  halo sources, which PyG cannot see locally (and ``GCNConv`` refuses bipartite input), so
  this one is written by hand: the edge weights ``w_ji = d_j^-1/2 d_i^-1/2`` are built here
  from ``LocalGraph.in_degree`` (global in-degrees of owned and halo rows), one self loop
  of weight 1 per owned row, ``d = in_degree - self_loops + 1`` (PyG's ``gcn_norm``: its
  ``add_remaining_self_loops`` replaces existing loops; without edge weights their weight
  is 1 even for ``improved=True``, which we replicate), and then the layer's own pieces run::

      xw  = conv.lin(h_src)                                   # [n_src, d']
      out = conv.propagate(ei_loops, x=xw, edge_weight=w, size=(n_src, n_own)) + conv.bias

  With ``transform_first`` and ``d' < d`` the exchange moves ``conv.lin(h)`` instead
  (narrower, the same numbers). The halo rows' self-loop counts are not local: they travel
  once, in :meth:`DistributedModel.setup` (a collective). ``normalize=False`` needs none.
* Any other ``MessagePassing`` class is refused when the model is wrapped
  (:class:`UnsupportedLayerError`), and so are settings that would need edge features in
  the global edge order (``edge_dim``), ``flow="target_to_source"``, or a ``GCNConv``
  subclass. Edge-level tensors passed at call time (``edge_weight``, ``edge_attr``) and an
  explicit ``size`` are refused too: they are in the global edge / node numbering.

Normalisations with statistics over *nodes* (``torch.nn.BatchNorm*``, ``InstanceNorm*``,
PyG ``BatchNorm``, ``InstanceNorm``, ``GraphNorm``, ``PairNorm``, ``DiffGroupNorm``,
``MeanSubtractionNorm``, ``GraphSizeNorm``, and PyG ``LayerNorm`` in its default
``mode="graph"``) would compute per-rank statistics: not the single-process model. They
are refused at wrap time (:class:`UnsupportedLayerError`), or with
``nonlocal_norm="warn"`` accepted with a :class:`UserWarning` (BatchNorm in eval mode uses
running statistics and is then row-wise and exact). ``torch.nn.LayerNorm`` and PyG
``LayerNorm(mode="node")`` are row-wise and exact. Note that PyG's ``MLP`` defaults to
``norm="batch_norm"``: pass ``norm=None`` (or a row-wise norm) inside a ``GINConv``.

What is written by hand, and why: PyG has no distributed full-batch wrapper (its
distributed package samples mini-batches), so the interception of each layer call, the
bipartite re-routing, the layer checks and ``GCNConv``'s global-degree normalisation live
here; the layers' own ``forward`` / ``propagate`` / parameters do all the arithmetic.

Mechanics: for the duration of one :meth:`DistributedModel.forward`, each supported layer
gets an instance attribute ``forward`` that shadows its class's method (so ``conv(...)``
goes through ``nn.Module.__call__`` and user hooks still run); it is deleted afterwards,
also when the call raises. The user's module is never modified: its parameters, buffers
and ``state_dict()`` keys are those of the plain PyG model (``DistributedModel``'s own
state dict has them under ``module.``).

Limits: each layer may be called once per forward (levers keep per-layer state keyed by
``l``); the user's code must not index node tensors with ``edge_index`` in the global
numbering; node-level extra arguments (e.g. ``batch``) are passed through untouched and
must be owned-row tensors; graph-level pooling over all nodes is not detected.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch
from torch import Tensor, nn
from torch_geometric.nn import (GATConv, GATv2Conv, GCNConv, GINConv, GraphConv, MessagePassing, SAGEConv,
                                TransformerConv)
from torch_geometric.nn import norm as pyg_norm

from commgnn.comm.halo.alltoall import AllToAllHalo
from commgnn.comm.halo.protocol import HaloExchange
from commgnn.errors import ConfigError
from commgnn.models.graph import LocalGraph

LayerKind = Literal["bipartite", "gcn"]

SUPPORTED_LAYERS: dict[type[MessagePassing], LayerKind] = {
    GCNConv: "gcn",
    SAGEConv: "bipartite",
    GraphConv: "bipartite",
    GINConv: "bipartite",
    GATConv: "bipartite",
    GATv2Conv: "bipartite",
    TransformerConv: "bipartite",
}
"""Layer classes (exact type, not subclasses: a subclass may use global quantities) that
:class:`DistributedModel` runs exactly, and how."""

_EDGE_ARGS = ("edge_weight", "edge_attr")
"""Call-time edge tensors: in the global edge order, which the local graph does not keep."""

_LOOPS_KEY = "byo_self_loops"
"""``LocalGraph._cache`` key of the ``[n_src]`` int64 self-loop counts of owned + halo rows."""


class UnsupportedLayerError(ConfigError):
    """The user's model holds a layer (or setting) :class:`DistributedModel` cannot run exactly."""


def supported_names() -> str:
    return ", ".join(sorted(cls.__name__ for cls in SUPPORTED_LAYERS))


def _nonlocal_norms() -> tuple[type[nn.Module], ...]:
    """Module types whose statistics span nodes (rows), not one row."""
    kinds: list[type[nn.Module]] = [nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm]
    for name in ("BatchNorm", "InstanceNorm", "GraphNorm", "PairNorm", "DiffGroupNorm", "MeanSubtractionNorm",
                 "GraphSizeNorm"):
        cls = getattr(pyg_norm, name, None)
        if isinstance(cls, type):
            kinds.append(cls)
    return tuple(kinds)


def _is_nonlocal_norm(mod: nn.Module) -> bool:
    if isinstance(mod, _nonlocal_norms()):
        return True
    pyg_layer_norm = getattr(pyg_norm, "LayerNorm", None)
    return isinstance(pyg_layer_norm, type) and isinstance(mod, pyg_layer_norm) and getattr(mod, "mode", "") == "graph"


def message_passing_layers(module: nn.Module) -> list[tuple[str, MessagePassing]]:
    """Top-level ``MessagePassing`` submodules in registration order (layers nested inside
    another ``MessagePassing`` belong to it and are not intercepted)."""
    found: list[tuple[str, MessagePassing]] = []

    def visit(mod: nn.Module, prefix: str) -> None:
        for name, child in mod.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, MessagePassing):
                found.append((path, child))
            else:
                visit(child, path + ".")

    if isinstance(module, MessagePassing):
        return [("", module)]
    visit(module, "")
    return found


def _check_layer(path: str, conv: MessagePassing) -> LayerKind:
    """The layer's kind, or :class:`UnsupportedLayerError` naming it."""
    cls = type(conv)
    where = f"layer '{path}' ({cls.__name__})" if path else f"layer {cls.__name__}"
    kind = SUPPORTED_LAYERS.get(cls)
    if kind is None:
        base = next((c.__name__ for c in SUPPORTED_LAYERS if isinstance(conv, c)), None)
        extra = f" (a subclass of {base}: subclasses may change the math and are not accepted)" if base else ""
        raise UnsupportedLayerError(
            f"DistributedModel cannot run {where} partition-parallel{extra}; supported message-passing "
            f"layers: {supported_names()}")
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        raise UnsupportedLayerError(f"{where}: flow='{conv.flow}' is not supported (only 'source_to_target')")
    if getattr(conv, "node_dim", -2) not in (-2, 0):
        raise UnsupportedLayerError(f"{where}: node_dim={conv.node_dim} is not supported")
    if getattr(conv, "edge_dim", None) is not None:
        raise UnsupportedLayerError(f"{where}: edge_dim={conv.edge_dim} needs edge features in the global edge "
                                    "order, which a partition does not keep; use edge_dim=None")
    return kind


@dataclass
class _Call:
    """State of one :meth:`DistributedModel.forward` call."""

    graph: LocalGraph
    halo: HaloExchange
    called: set[int] = field(default_factory=set)


class DistributedModel(nn.Module):
    """Runs a user's PyG model on one rank's partition plus halo, exactly (see module doc).

    Args:
        module: the user's model, ``module(x, edge_index, *extra) -> [num_nodes, C]``.
        transform_first: ``GCNConv`` only: exchange ``conv.lin(h)`` instead of ``h`` when
            the layer narrows (``out_channels < in_channels``); exact, fewer halo bytes.
        nonlocal_norm: ``"error"`` (default) refuses norms with statistics over nodes
            (BatchNorm, GraphNorm, ...; not exact across ranks), ``"warn"`` accepts them
            with a ``UserWarning``.

    Raises :class:`UnsupportedLayerError` at construction for a layer or setting that
    cannot run exactly. All ranks must wrap the same architecture (the exchanges are
    collectives, one per message-passing layer call, in the same order on every rank).
    """

    def __init__(self, module: nn.Module, *, transform_first: bool = False,
                 nonlocal_norm: Literal["error", "warn"] = "error") -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ConfigError(f"DistributedModel wraps an nn.Module, got {type(module).__name__}")
        if nonlocal_norm not in ("error", "warn"):
            raise ConfigError(f"nonlocal_norm must be 'error' or 'warn', got {nonlocal_norm!r}")
        layers = message_passing_layers(module)
        if not layers:
            raise UnsupportedLayerError(f"{type(module).__name__} contains no torch_geometric MessagePassing layer; "
                                        f"supported layers: {supported_names()}")
        self.kinds: list[LayerKind] = [_check_layer(path, conv) for path, conv in layers]
        self.layer_paths: list[str] = [path for path, _ in layers]
        norms = [f"'{name}' ({type(m).__name__})" for name, m in module.named_modules() if _is_nonlocal_norm(m)]
        if norms:
            msg = (f"{', '.join(norms)} normalise(s) with statistics over nodes: each rank would use its own "
                   "partition's statistics, which is not the single-process model. Use a row-wise norm "
                   "(torch.nn.LayerNorm, PyG LayerNorm(mode='node')) or pass nonlocal_norm='warn' to accept it")
            if nonlocal_norm == "error":
                raise UnsupportedLayerError(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
        self.module = module
        self.transform_first = transform_first
        self._forwards = [_forward_params(type(conv)) for _, conv in layers]

    @property
    def num_layers(self) -> int:
        """Message-passing layers = exchange layer indices ``0 .. num_layers-1`` (what
        :func:`commgnn.comm.build.build_halo` wants as ``num_layers``)."""
        return len(self.kinds)

    @property
    def needs_setup(self) -> bool:
        """Whether :meth:`setup` exchanges anything (a ``GCNConv`` that adds self loops)."""
        return any(kind == "gcn" and self._layer(i).normalize and self._layer(i).add_self_loops
                   for i, kind in enumerate(self.kinds))

    def _layer(self, index: int) -> Any:
        path = self.layer_paths[index]
        return self.module if path == "" else self.module.get_submodule(path)

    @torch.no_grad()
    def setup(self, graph: LocalGraph, halo: HaloExchange) -> None:
        """One-time preparation: a collective when :attr:`needs_setup`, so every rank calls
        it at the same point, with an *exact* exchange (lossy levers would corrupt degrees).

        Sends each owned node's self-loop count to the ranks that hold it as a halo row
        (``[n_own, 1]`` float64, counted as ``halo_setup``) and keeps the ``[n_src]``
        counts in ``graph._cache`` for ``GCNConv``'s global degrees."""
        if not self.needs_setup or _LOOPS_KEY in graph._cache:
            return
        src, dst = graph.edge_index
        own_loops = torch.bincount(dst[src == dst], minlength=graph.num_own)[: graph.num_own]
        halo_loops = halo.exchange(own_loops.to(torch.float64).unsqueeze(1), 0, kind="halo_setup")
        loops = torch.cat([own_loops, halo_loops.squeeze(1).round().to(torch.int64)])
        if loops.numel() != graph.num_src:
            raise RuntimeError(f"halo exchange returned {loops.numel() - graph.num_own} rows, "
                               f"expected {graph.num_src - graph.num_own}")
        graph._cache[_LOOPS_KEY] = loops

    def forward(self, x: Tensor, graph: LocalGraph, halo: HaloExchange, *args: Any, **kwargs: Any) -> Any:
        """``x [n_own, F] -> module(x, graph.edge_index, *args, **kwargs)``, normally ``[n_own, C]``."""
        if x.dim() < 1 or x.shape[0] != graph.num_own:
            raise ValueError(f"x has {x.shape[0] if x.dim() else 0} rows, the partition owns {graph.num_own}")
        if self.needs_setup and _LOOPS_KEY not in graph._cache:
            if isinstance(halo, AllToAllHalo) or not getattr(halo, "is_distributed", True):
                self.setup(graph, halo)  # exact exchange: safe to do here (same point on every rank)
            else:
                raise RuntimeError("DistributedModel.setup(graph, exact_halo) must run on every rank before the "
                                   "first forward with a lossy halo exchange (GCNConv needs the halo rows' degrees)")
        call = _Call(graph, halo)
        installed: list[nn.Module] = []
        try:
            for i in range(len(self.kinds)):
                conv = self._layer(i)
                conv.__dict__["forward"] = self._interceptor(conv, i, call)
                installed.append(conv)
            return self.module(x, graph.edge_index, *args, **kwargs)
        finally:
            for conv in installed:
                conv.__dict__.pop("forward", None)

    def _interceptor(self, conv: MessagePassing, index: int, call: _Call) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            if index in call.called:
                raise ConfigError(f"layer '{self.layer_paths[index]}' ({type(conv).__name__}) was called twice in one "
                                  "forward; DistributedModel needs each message-passing layer called at most once")
            call.called.add(index)
            bound = _bind(conv, self._forwards[index], args, kwargs)
            if self.kinds[index] == "gcn":
                return self._gcn(conv, index, call, bound)
            return self._bipartite(conv, index, call, bound)
        return forward

    def _source_rows(self, h: Tensor, index: int, call: _Call, where: str) -> Tensor:
        """``cat(h, halo.exchange(h, index))``: ``[n_own, ...] -> [n_src, ...]``. Every rank
        calls the exchange, halo rows or not: its backward is a collective."""
        g = call.graph
        if not isinstance(h, Tensor) or h.dim() != 2 or h.shape[0] != g.num_own:
            shape = tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise ValueError(f"{where}: expected node features [n_own={g.num_own}, d], got {shape} "
                             "(pairs of tensors and global node tensors are not supported)")
        return torch.cat([h, call.halo.exchange(h, index)])

    def _bipartite(self, conv: MessagePassing, index: int, call: _Call, bound: dict[str, Any]) -> Any:
        g = call.graph
        where = f"layer '{self.layer_paths[index]}' ({type(conv).__name__})"
        h = bound.pop("x")
        edge_index = bound.pop("edge_index")
        x_src = self._source_rows(h, index, call, where)
        if "size" in self._forwards[index]:
            bound["size"] = (g.num_src, g.num_own)
        return type(conv).forward(conv, (x_src, h), edge_index, **bound)

    def _gcn(self, conv: Any, index: int, call: _Call, bound: dict[str, Any]) -> Tensor:
        g = call.graph
        where = f"layer '{self.layer_paths[index]}' (GCNConv)"
        h, edge_index = bound.pop("x"), bound.pop("edge_index")
        if conv.normalize and edge_index is not g.edge_index:
            raise ConfigError(f"{where}: received an edge_index other than the one DistributedModel passed in; "
                              "GCN normalisation is built for the partition's own edges")
        narrow = self.transform_first and isinstance(h, Tensor) and h.dim() == 2 and conv.out_channels < h.shape[1]
        if narrow:
            xw = self._source_rows(conv.lin(h), index, call, where)
        else:
            xw = conv.lin(self._source_rows(h, index, call, where))
        if conv.normalize:
            ei, w = gcn_weights(g, conv.add_self_loops, xw.dtype)
        else:
            ei, w = edge_index, None
        out = conv.propagate(ei, x=xw, edge_weight=w, size=(g.num_src, g.num_own))
        if conv.bias is not None:
            out = out + conv.bias
        return out


def gcn_weights(graph: LocalGraph, add_self_loops: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """PyG ``gcn_norm`` (no input edge weights) restricted to owned targets, with global degrees.

    Returns ``(edge_index [2, E'], w [E'])``: with ``add_self_loops`` the local edges minus
    existing loops plus one loop ``i -> i`` per owned row, ``d = in_degree - loops + 1``;
    without, every local edge and ``d = in_degree``. ``w_ji = d_j^-1/2 d_i^-1/2`` (0 where
    ``d = 0``), computed in float64 and cached in ``graph._cache`` per setting and dtype."""
    key = ("byo_gcn", add_self_loops, dtype)
    if key in graph._cache:
        return graph._cache[key]
    src, dst = graph.edge_index
    deg = graph.in_degree.to(torch.float64)
    if add_self_loops:
        loops = graph._cache.get(_LOOPS_KEY)
        if loops is None:
            raise RuntimeError("GCNConv with add_self_loops needs DistributedModel.setup(graph, exact_halo) first")
        deg = deg - loops.to(deg) + 1.0
        keep = src != dst
        own = torch.arange(graph.num_own, device=src.device)
        ei = torch.cat([graph.edge_index[:, keep], torch.stack([own, own])], dim=1)
    else:
        ei = graph.edge_index
    dinv = deg.pow(-0.5)
    dinv.masked_fill_(torch.isinf(dinv), 0.0)
    w = (dinv[ei[0]] * dinv[ei[1]]).to(dtype)
    graph._cache[key] = (ei, w)
    return ei, w


def _forward_params(cls: type[MessagePassing]) -> list[str]:
    """Parameter names of the class's ``forward`` after ``self``."""
    return list(inspect.signature(cls.forward).parameters)[1:]


def _bind(conv: MessagePassing, params: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name; refuses edge tensors and an explicit ``size`` (both
    in the global numbering)."""
    name = type(conv).__name__
    if len(args) > len(params):
        raise TypeError(f"{name}.forward takes {len(params)} arguments, got {len(args)}")
    bound = dict(zip(params, args))
    for k, v in kwargs.items():
        if k not in params:
            raise TypeError(f"{name}.forward got an unexpected keyword argument '{k}'")
        if k in bound:
            raise TypeError(f"{name}.forward got multiple values for argument '{k}'")
        bound[k] = v
    if "x" not in bound or "edge_index" not in bound:
        raise TypeError(f"{name}.forward needs x and edge_index")
    for k in _EDGE_ARGS:
        if bound.get(k) is not None:
            raise ConfigError(f"{name}: {k} is not supported by DistributedModel (edge tensors are in the global "
                              "edge order, a partition keeps its own)")
    if bound.get("size") is not None:
        raise ConfigError(f"{name}: do not pass size; DistributedModel sets the local (n_src, n_own) size")
    bound.pop("size", None)
    return bound
