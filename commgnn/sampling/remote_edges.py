"""Every in-edge of any node over a *partitioned* topology (VR-GCN's control variate).

VR-GCN's history term averages over *all* in-neighbours of a block's destinations, so on a
partitioned topology a rank needs the whole in-edge lists of other ranks' nodes, not a
sample of them (:mod:`commgnn.sampling.remote`). At set-up every rank learns, for every node
v of the graph, its in-degree ``deg[v]`` and where its list starts in its owner's CSR,
``start[v]`` (the trainer all-gathers the owners' ``[n_own]`` vectors). A call expands each
node into its ``deg[v]`` positions ``start[v] .. start[v] + deg[v] - 1`` and asks the owners
for those entries of their ``indices`` in one request-reply round
(:func:`~commgnn.dist.request.request_reply`), a position out and a source id back per edge,
counted as ``topology`` traffic::

    nodes [n]  ->  positions [e] int64 (e = sum deg[nodes])  ->  src [e] int64 global ids

Own nodes are answered locally, without bytes on the wire. The lists come back in the
owner's CSR order (ascending sources per node), the order of the replicated CSR, so the
batches equal the replicated topology's. Ranges expand with ``repeat_interleave``, no
per-node loop. Written here: no maintained library serves CSR rows across ranks over
``torch.distributed``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.dist.context import DistContext
from commgnn.dist.events import Hooks
from commgnn.dist.request import request_reply
from commgnn.sampling.csr import CSRTopology


class RemoteInEdges:
    """``neighbours_of`` and ``in_degree`` of :class:`~commgnn.sampling.csr.CSRTopology`
    over a partitioned topology (a collective: every rank calls it the same number of times)."""

    def __init__(self, ctx: DistContext, hooks: Hooks, *, own_csr: CSRTopology, owner: Tensor, deg: Tensor,
                 start: Tensor, group: dist.ProcessGroup | None = None) -> None:
        """``own_csr``: in-edges of this rank's nodes (targets numbered by their row here,
        sources in global ids); ``owner [N]``: every node's rank; ``deg [N]`` / ``start [N]``
        int64: every node's in-degree and its list's offset in its owner's ``indices``."""
        self.ctx, self.hooks, self.group = ctx, hooks, group
        self.csr, self.owner, self.deg, self.start = own_csr, owner, deg, start

    def in_degree(self) -> Tensor:
        """``[N]`` int64 in-degree of every node."""
        return self.deg

    def neighbours_of(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """All in-edges of ``nodes [n]``: ``(src [e] int64 global ids, pos [e] int64 into
        nodes)``, grouped by position; one request-reply round, entered even with no nodes."""
        nodes = nodes.to(torch.int64)
        d = self.deg[nodes]
        pos = torch.repeat_interleave(torch.arange(nodes.numel()), d)
        offs = torch.arange(int(d.sum())) - torch.repeat_interleave(torch.cumsum(d, 0) - d, d)
        where = self.start[nodes][pos] + offs

        def serve(positions: Tensor) -> Tensor:
            return self.csr.indices[positions].to(torch.int64)

        src = request_reply(self.ctx, self.hooks, self.owner[nodes][pos], where, serve,
                            req_kind="topology", rep_kind="topology", group=self.group)
        return src, pos
