"""GraphSAINT subgraph samplers (Zeng et al., ICLR 2020) for one rank: node, edge, random walk.

Each step draws a node set ``S`` (sorted unique global ids, ``[k]``) and trains on the subgraph
it induces in the *whole* graph: every edge ``u -> v`` with ``u, v in S``. Every layer runs on
that same subgraph, so all ``num_layers`` blocks carry the same ``[2, e]`` edges with
``num_src = num_dst = k``. How ``S`` is drawn (``budget`` draws with replacement, kept unique):

* ``node``: the rank's *pool* (its own nodes and their in-neighbours, which may be other
  ranks' nodes), ``P(v) ∝ deg_v + 1`` (the ``+1`` lets isolated nodes be drawn);
* ``edge``: in-edges ``u -> v`` of own nodes ``v`` (``u`` may be another rank's node),
  ``P(u -> v) ∝ 1 / deg_u + 1 / deg_v`` (degrees clamped to >= 1); ``S`` = both endpoints;
* ``rw``: roots uniform among own training nodes (all own nodes if none trains), each walking
  ``walk_length`` steps to a uniform in-neighbour (a node without one stays); ``S`` = visited.

Normalisation (GraphSAINT section 3.2). A subgraph over-represents what the sampler favours,
so both the aggregation and the loss are reweighted with inclusion probabilities estimated
by pre-sampling ``presample`` subgraphs at construction: ``C_v`` counts the subgraphs holding
node v (``[N]``), ``C_e`` the induced subgraphs holding edge e (``[E]``, e = its position in
``csr.indices``); zero counts are clamped to 1. Then, with ``deg_v`` v's full in-degree::

    p_v = C_v / presample                                       node_prob: [N]
    w_uv = (1 / deg_v) * C_v / C_e     (e = u -> v)             edge_weight: [E]

    E[ sum_{u in S, u->v} w_uv h_u | v in S ] = sum_{u->v} (p_e / p_v) (p_v / p_e) h_u / deg_v
                                              = mean_{u->v} h_u       (unbiased mean aggregation)
    E[ sum_{v in S ∩ train} loss_v / p_v ] = sum_{v in train} loss_v    (unbiased loss)

so ``Block.weight = w`` and ``MiniBatch.target_weight = 1 / p_v`` over the subgraph's own
training nodes. Both identities hold over what the sampler can reach (``p_e > 0``, ``p_v > 0``):
every in-edge of an own node lies in the node sampler's pool, so the own nodes' aggregation is
unbiased, but a pooled neighbour's own in-edges from beyond the pool never appear (a deeper
layer sees that one-hop truncation); isolated nodes never enter an edge-sampler subgraph, and a
walk never reaches past ``walk_length`` hops from the training nodes (so edges into its outermost
nodes from beyond are missing). That bias comes from the sampler's reach, not from the weights.
(An own-nodes-only node sampler, tried first, drops every edge from another rank's node: its
aggregation then only estimates the rank-local part of the mean.)

**Partitioned topology** (:class:`~commgnn.sampling.remote_edges.PartitionedEdges`): the
in-edges of a subgraph's nodes come from their owners in one round, edge ids number the
edges owner by owner, ``C_e`` is kept only for the edges pre-sampling met (sorted ids and
counts, not ``[E]``), and a walk's step is drawn by the node's owner. The node and edge
samplers then draw exactly what they draw on the replicated CSR (the pool, the own in-edges
and the degrees are all a rank needs). Every rank makes every call, also with no nodes.

Everything is vectorised (inverse-CDF sampling with ``searchsorted``, CSR gathers, ``unique``);
the only Python loops run over draws and walk steps, never over nodes. All randomness comes
from the ``torch.Generator`` passed in (pre-sampling uses its own, seeded by ``seed``), except
a partitioned topology's walk steps, which the owners draw from their serving streams.
"""

from __future__ import annotations

import math
from typing import Iterator, Literal, Protocol

import torch
from torch import Tensor

from commgnn.sampling.base import Block, MiniBatch, empty_batch
from commgnn.sampling.csr import CSRTopology

SaintKind = Literal["node", "edge", "rw"]
"""Which GraphSAINT sampler: ``node``, ``edge`` or random walk (``rw``)."""

_KINDS = ("node", "edge", "rw")

SAINT_BYTES_PER_EDGE = 12
"""What the normalisation keeps per edge of the graph on a replicated CSR: ``edge_weight``
(float64) and ``edge_count`` (int32)."""


def _in_edge_ids(csr: CSRTopology, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """All in-edges of ``nodes`` as ``(eid [e] int64 positions in csr.indices, pos [e] int64
    index into nodes)``, grouped by position (the gather of :meth:`CSRTopology.neighbours_of`,
    keeping the edge ids that index ``C_e`` and ``edge_weight``)."""
    nodes = nodes.to(torch.int64)
    start = csr.indptr[nodes]
    deg = csr.indptr[nodes + 1] - start
    pos = torch.repeat_interleave(torch.arange(nodes.numel()), deg)
    offs = torch.arange(int(deg.sum())) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg)
    return start[pos] + offs, pos


class SubgraphEdges(Protocol):
    """The topology a GraphSAINT sampler reads: :class:`LocalEdges` over the replicated CSR,
    or :class:`~commgnn.sampling.remote_edges.PartitionedEdges` (``collective``: every rank
    makes every call, also with no nodes)."""

    collective: bool

    def in_degree(self) -> Tensor:
        """``[N]`` int64 in-degree of every node."""
        ...

    def in_edges(self, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """All in-edges of ``nodes``: ``(src [e] global ids, pos [e] into nodes, eid [e]
        global edge ids)``, grouped by position."""
        ...

    def walk_step(self, cur: Tensor, generator: torch.Generator) -> Tensor:
        """``[m]``: a uniform in-neighbour of each node of ``cur`` (itself if it has none)."""
        ...


class LocalEdges:
    """:class:`SubgraphEdges` over a whole-graph CSR; edge ids are positions in ``indices``."""

    collective = False

    def __init__(self, csr: CSRTopology) -> None:
        self.csr = csr

    def in_degree(self) -> Tensor:
        return self.csr.in_degree()

    def in_edges(self, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        eid, pos = _in_edge_ids(self.csr, nodes)
        return self.csr.indices[eid].to(torch.int64), pos, eid

    def walk_step(self, cur: Tensor, generator: torch.Generator) -> Tensor:
        start = self.csr.indptr[cur]
        deg = self.csr.indptr[cur + 1] - start
        offs = (torch.rand(cur.numel(), generator=generator, dtype=torch.float64) * deg).to(torch.int64)
        # the clamp keeps the gather in range for stuck nodes (deg 0 at the end of indices)
        step = (start + torch.minimum(offs, (deg - 1).clamp(min=0))).clamp_(max=max(self.csr.num_edges - 1, 0))
        nxt = self.csr.indices[step].to(torch.int64) if self.csr.num_edges else cur
        return torch.where(deg > 0, nxt, cur)


def _draw_from_cdf(cdf: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """``k`` indices drawn with replacement, ``P(i) ∝ cdf[i] - cdf[i - 1]``: inverse-CDF
    sampling (``torch.multinomial`` caps the category count at 2^24, edges exceed that)."""
    u = torch.rand(k, generator=generator, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1)


def _member(sorted_ids: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
    """``(mask [q] bool, loc [q] int64)``: whether each query is in ``sorted_ids`` and where."""
    if sorted_ids.numel() == 0:
        return torch.zeros(query.numel(), dtype=torch.bool), torch.zeros(query.numel(), dtype=torch.int64)
    loc = torch.searchsorted(sorted_ids, query).clamp_(max=sorted_ids.numel() - 1)
    return sorted_ids[loc] == query, loc


class SaintSampler:
    """GraphSAINT node / edge / random-walk subgraph sampler over one rank's nodes (see the
    module docstring); implements :class:`~commgnn.sampling.base.Sampler`."""

    num_layers: int
    """Blocks per batch (all carry the same induced subgraph)."""
    node_prob: Tensor
    """``[N]`` float64 estimated inclusion probability ``p_v = max(C_v, 1) / presample``."""
    edge_weight: Tensor | None
    """``[E]`` float64 aggregation weight ``(1 / deg_v) * max(C_v, 1) / max(C_e, 1)`` of each
    edge, aligned with ``csr.indices`` (None on a partitioned topology: see ``edge_count``)."""
    node_count: Tensor
    """``[N]`` int64 ``C_v`` from pre-sampling (before clamping)."""
    edge_count: Tensor
    """``[E]`` int32 ``C_e`` from pre-sampling (before clamping); on a partitioned topology
    only the edges pre-sampling met, ``[m]``, at the sorted global ids ``edge_count_ids``."""
    mean_subgraph_size: float
    """Mean node count of the pre-sampled subgraphs."""

    def __init__(self, csr: CSRTopology | SubgraphEdges, own_nodes: Tensor, train_mask: Tensor, *, kind: SaintKind,
                 num_layers: int, budget: int, walk_length: int = 2, presample: int = 50,
                 steps: int = 0, seed: int = 0) -> None:
        """``own_nodes``: ``[n]`` ascending global ids of this rank's nodes; ``train_mask``:
        ``[n]`` bool aligned with it; ``csr``: the whole graph in global ids (or a partitioned
        topology's :class:`SubgraphEdges`: every rank then makes the same collective calls,
        here at pre-sampling and in every batch). ``budget``: node
        draws (``node``), edge draws (``edge``) or walk roots (``rw``) per subgraph;
        ``steps`` > 0 fixes :meth:`num_batches`; ``seed`` seeds pre-sampling."""
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        if walk_length < 0:
            raise ValueError(f"walk_length must be >= 0, got {walk_length}")
        if presample < 1:
            raise ValueError(f"presample must be >= 1 (the normalisation is estimated from it), got {presample}")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        own_nodes = own_nodes.to(torch.int64).reshape(-1)
        train_mask = train_mask.to(torch.bool).reshape(-1)
        if train_mask.numel() != own_nodes.numel():
            raise ValueError(f"train_mask has {train_mask.numel()} entries for {own_nodes.numel()} own nodes")
        if own_nodes.numel() > 1 and not bool((own_nodes[1:] > own_nodes[:-1]).all()):
            raise ValueError("own_nodes must be strictly ascending")
        self.edges: SubgraphEdges = LocalEdges(csr) if isinstance(csr, CSRTopology) else csr
        self.deg = self.edges.in_degree()
        """``[N]`` int64 full in-degree."""
        num_nodes = int(self.deg.numel())
        if own_nodes.numel() and (int(own_nodes[0]) < 0 or int(own_nodes[-1]) >= num_nodes):
            raise ValueError(f"own_nodes out of range [0, {num_nodes})")

        self.csr = csr if isinstance(csr, CSRTopology) else None
        """The whole graph's CSR (None on a partitioned topology)."""
        self.collective = self.edges.collective
        self.own_nodes = own_nodes
        self.kind: SaintKind = kind
        self.num_layers = num_layers
        self.budget = budget
        self.walk_length = walk_length
        self.presample = presample
        self.steps = steps
        self.seed = seed
        self.own_train = own_nodes[train_mask]
        """``[t]`` ascending global ids of own training nodes (the loss targets)."""
        self._prepare_draws(train_mask)
        self._presample()

    # ----------------------------------------------------------------- drawing

    def _prepare_draws(self, train_mask: Tensor) -> None:
        """Per-kind tables the draws reuse: a CDF over own nodes or own in-edges, or the roots."""
        own = self.own_nodes
        if self.kind == "node":
            self._pool = torch.unique(torch.cat([own, self.edges.in_edges(own)[0]]))
            self._cdf = torch.cumsum((self.deg[self._pool] + 1).to(torch.float64), 0)
        elif self.kind == "edge":
            src, pos, _ = self.edges.in_edges(own)
            self._edge_src, self._edge_dst = src, own[pos]
            inv = 1.0 / self.deg.clamp(min=1).to(torch.float64)
            self._cdf = torch.cumsum(inv[src] + inv[own][pos], 0)
        else:
            self._roots = self.own_train if self.own_train.numel() else own

    def draw(self, generator: torch.Generator) -> Tensor:
        """Sorted unique ``[k]`` int64 global node ids of one subgraph draw (empty if this rank
        owns nothing, or, for the edge sampler, no own node has an in-edge). On a partitioned
        topology a rank without nodes still takes part in the walk steps' rounds."""
        if self.own_nodes.numel() == 0:
            if self.collective and self.kind == "rw":
                self._walk(generator, torch.zeros(0, dtype=torch.int64))
            return torch.zeros(0, dtype=torch.int64)
        if self.kind == "node":
            return torch.unique(self._pool[_draw_from_cdf(self._cdf, self.budget, generator)])
        if self.kind == "edge":
            if self._edge_src.numel() == 0:
                return torch.zeros(0, dtype=torch.int64)
            pick = _draw_from_cdf(self._cdf, self.budget, generator)
            return torch.unique(torch.cat([self._edge_src[pick], self._edge_dst[pick]]))
        roots = self._roots[torch.randint(self._roots.numel(), (self.budget,), generator=generator)]
        return torch.unique(self._walk(generator, roots))

    def _walk(self, generator: torch.Generator, roots: Tensor) -> Tensor:
        """``[budget * (walk_length + 1)]`` visited global ids of uniform walks from ``roots``."""
        visited = [roots]
        cur = roots
        for _ in range(self.walk_length):
            cur = self.edges.walk_step(cur, generator)
            visited.append(cur)
        return torch.cat(visited)

    # ---------------------------------------------------------- induced subgraph

    def _induced(self, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Edges of the graph with both ends in sorted ``nodes``: ``(src_local, dst_local,
        eid)``, each ``[e]`` int64, sorted by destination."""
        src, pos, eid = self.edges.in_edges(nodes)
        inside, loc = _member(nodes, src)
        return loc[inside], pos[inside], eid[inside]

    def _edge_weights(self, nodes: Tensor, dst: Tensor, eid: Tensor) -> Tensor:
        """``[e]`` float64 ``(1 / deg_v) * max(C_v, 1) / max(C_e, 1)`` of edges ``eid`` into
        ``nodes[dst]`` (read from ``edge_weight``, or from the sparse counts when partitioned)."""
        if self.edge_weight is not None:
            return self.edge_weight[eid]
        v = nodes[dst]
        met, loc = _member(self.edge_count_ids, eid)
        c_e = torch.where(met, self.edge_count[loc] if self.edge_count.numel() else 0, 0).clamp(min=1)
        inv_deg = 1.0 / self.deg[v].clamp(min=1).to(torch.float64)
        return inv_deg * self.node_count[v].clamp(min=1).to(torch.float64) / c_e.to(torch.float64)

    def subgraph(self, nodes: Tensor) -> MiniBatch:
        """The batch of the subgraph induced by ``nodes`` (sorted unique global ids): every
        layer carries its edges with GraphSAINT weights ``edge_weight``; targets are the own
        training nodes among ``nodes``, weighted ``1 / node_prob``."""
        nodes = nodes.to(torch.int64)
        if nodes.numel() == 0 and not self.collective:
            return empty_batch(self.num_layers)
        src, dst, eid = self._induced(nodes)  # a round every rank enters when partitioned
        if nodes.numel() == 0:
            return empty_batch(self.num_layers)
        edge_index = torch.stack([src, dst])
        weight = self._edge_weights(nodes, dst, eid)
        k = int(nodes.numel())
        blocks = [Block(edge_index=edge_index, num_src=k, num_dst=k, weight=weight)
                  for _ in range(self.num_layers)]
        is_target, _ = _member(self.own_train, nodes)
        target = torch.nonzero(is_target).reshape(-1)
        target_weight = 1.0 / self.node_prob[nodes[target]]
        return MiniBatch(nodes=nodes, blocks=blocks, target=target, target_weight=target_weight)

    # ------------------------------------------------------------ normalisation

    def _presample(self) -> None:
        """Count ``C_v`` and ``C_e`` over ``presample`` draws and derive ``node_prob`` and
        ``edge_weight`` (module docstring)."""
        n_nodes = int(self.deg.numel())
        c_v = torch.zeros(n_nodes, dtype=torch.int64)
        # replicated: C_e over every edge of the CSR; partitioned: the edge ids met, counted
        # at the end (the graph's edge count is not this rank's to hold)
        c_e = torch.zeros(self.csr.num_edges, dtype=torch.int32) if self.csr is not None else None
        met_ids = torch.zeros(0, dtype=torch.int64)  # partitioned: sorted edge ids met so far
        met_counts = torch.zeros(0, dtype=torch.int32)
        total_nodes = 0
        if self.own_nodes.numel() or self.collective:
            gen = torch.Generator().manual_seed(self.seed)
            one = torch.ones(1, dtype=torch.int32)
            for _ in range(self.presample):
                nodes = self.draw(gen)
                total_nodes += int(nodes.numel())
                c_v[nodes] += 1  # nodes and induced edge ids are unique within a draw
                eid = self._induced(nodes)[2]
                if c_e is not None:
                    c_e[eid] += one
                else:  # fold each draw in: memory stays that of the distinct edges met
                    met_ids, inverse = torch.unique(torch.cat([met_ids, eid]), return_inverse=True)
                    met_counts = torch.zeros(met_ids.numel(), dtype=torch.int32).index_add_(
                        0, inverse, torch.cat([met_counts, one.expand(eid.numel())]))
        self.node_count = c_v
        self.mean_subgraph_size = total_nodes / self.presample
        cv = c_v.clamp(min=1).to(torch.float64)
        self.node_prob = cv / self.presample
        if c_e is None:
            self.edge_count_ids, self.edge_count = met_ids, met_counts
            self.edge_weight = None
            return
        self.edge_count = c_e
        self.edge_count_ids = None
        dst = torch.repeat_interleave(torch.arange(n_nodes), self.deg)  # the target of each edge
        inv_deg = 1.0 / self.deg.clamp(min=1).to(torch.float64)
        self.edge_weight = (inv_deg * cv)[dst] / c_e.clamp(min=1).to(torch.float64)

    # ------------------------------------------------------------------- epochs

    def num_batches(self) -> int:
        """``steps`` if given, else enough subgraphs to cover the rank's nodes once on average:
        ``max(1, ceil(n / mean pre-sampled subgraph size))``; 0 for a rank with no nodes."""
        if self.steps > 0:
            return self.steps
        n = int(self.own_nodes.numel())
        if n == 0:
            return 0
        return max(1, math.ceil(n / max(self.mean_subgraph_size, 1.0)))

    def epoch(self, steps: int, generator: torch.Generator) -> Iterator[MiniBatch]:
        """Exactly ``steps`` independent subgraph batches (empty batches on a rank with no
        nodes, so it still enters every step's collectives)."""
        for _ in range(steps):
            if self.own_nodes.numel() == 0 and not self.collective:
                yield empty_batch(self.num_layers)
            else:
                yield self.subgraph(self.draw(generator))
