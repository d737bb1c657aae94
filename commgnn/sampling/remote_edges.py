"""Every in-edge of any node over a *partitioned* topology (VR-GCN, GraphSAINT).

VR-GCN's history term averages over *all* in-neighbours of a block's destinations, and a
GraphSAINT subgraph holds every edge between its nodes, so on a partitioned topology a rank
needs the whole in-edge lists of other ranks' nodes, not a sample of them
(:mod:`commgnn.sampling.remote`). At set-up every rank learns, for every node
v of the graph, its in-degree ``deg[v]`` and where its list starts in its owner's CSR,
``start[v]`` (the trainer all-gathers the owners' ``[n_own]`` vectors). A call expands each
node into its ``deg[v]`` positions ``start[v] .. start[v] + deg[v] - 1`` and asks the owners
for those entries of their ``indices`` in one request-reply round
(:func:`~commgnn.distributed.request.request_reply`), a position out and a source id back per edge,
counted as ``topology`` traffic::

    nodes [n]  ->  positions [e] int64 (e = sum deg[nodes])  ->  src [e] int64 global ids

Own nodes are answered locally, without bytes on the wire. The lists come back in the
owner's CSR order (ascending sources per node), the order of the replicated CSR, so the
batches equal the replicated topology's. Ranges expand with ``repeat_interleave``, no
per-node loop. Written here: no maintained library serves CSR rows across ranks over
``torch.distributed``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.distributed.request import request_reply
from commgnn.sampling.csr import CSRTopology


class RemoteInEdges:
    """``neighbours_of`` and ``in_degree`` of :class:`~commgnn.sampling.csr.CSRTopology`
    over a partitioned topology (a collective: every rank calls it the same number of times)."""

    def __init__(self, ctx: DistContext, hooks: Hooks, *, own_csr: CSRTopology, owner: Tensor, deg: Tensor,
                 start: Tensor, edge_base: Tensor | None = None, group: dist.ProcessGroup | None = None) -> None:
        """``own_csr``: in-edges of this rank's nodes (targets numbered by their row here,
        sources in global ids); ``owner [N]``: every node's rank; ``deg [N]`` / ``start [N]``
        int64: every node's in-degree and its list's offset in its owner's ``indices``;
        ``edge_base [P]``: the global id of each rank's first edge (edge ids then number the
        graph's edges owner by owner, as GraphSAINT's normalisation needs)."""
        self.ctx, self.hooks, self.group = ctx, hooks, group
        self.csr, self.owner, self.deg, self.start = own_csr, owner, deg, start
        self.edge_base = edge_base if edge_base is not None else torch.zeros(ctx.world_size, dtype=torch.int64)

    def in_degree(self) -> Tensor:
        """``[N]`` int64 in-degree of every node."""
        return self.deg

    def neighbours_of(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """All in-edges of ``nodes [n]``: ``(src [e] int64 global ids, pos [e] int64 into
        nodes)``, grouped by position; one request-reply round, entered even with no nodes."""
        src, pos, _ = self.in_edges(nodes)
        return src, pos

    def in_edges(self, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`neighbours_of` and each edge's global id ``eid [e]`` (``edge_base`` of its
        owner plus its position in the owner's ``indices``)."""
        nodes = nodes.to(torch.int64)
        d = self.deg[nodes]
        pos = torch.repeat_interleave(torch.arange(nodes.numel()), d)
        offs = torch.arange(int(d.sum())) - torch.repeat_interleave(torch.cumsum(d, 0) - d, d)
        where = self.start[nodes][pos] + offs

        def serve(positions: Tensor) -> Tensor:
            return self.csr.indices[positions].to(torch.int64)

        owners = self.owner[nodes][pos]
        src = request_reply(self.ctx, self.hooks, owners, where, serve,
                            req_kind="topology", rep_kind="topology", group=self.group)
        return src, pos, self.edge_base[owners] + where


class PartitionedEdges:
    """GraphSAINT's view of a partitioned topology (:class:`~commgnn.sampling.saint.SubgraphEdges`):
    whole in-edge lists with global edge ids from :class:`RemoteInEdges`, and a random walk's
    step to a uniform in-neighbour drawn by the node's owner (a
    :class:`~commgnn.sampling.remote.RemoteNeighbors` round at fan-out 1). Every call is a
    collective round."""

    collective = True

    def __init__(self, edges: RemoteInEdges, walker: Any) -> None:
        self.edges, self.walker = edges, walker

    @property
    def group(self) -> dist.ProcessGroup | None:
        return self.edges.group

    @group.setter
    def group(self, group: dist.ProcessGroup | None) -> None:
        self.edges.group = self.walker.group = group

    def in_degree(self) -> Tensor:
        return self.edges.in_degree()

    def in_edges(self, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.edges.in_edges(nodes)

    def walk_step(self, cur: Tensor, generator: torch.Generator) -> Tensor:
        """``[m]``: a uniform in-neighbour of each node of ``cur [m]`` (the node itself if it has none)."""
        src, pos = self.walker(cur, 1, generator)
        nxt = cur.clone()
        nxt[pos] = src
        return nxt
