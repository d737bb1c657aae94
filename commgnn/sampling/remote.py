"""Neighbour sampling over a *partitioned* topology: owners sample their own nodes.

When the replicated CSR would not fit (``minibatch.topology``), each rank keeps only the
in-edges of the nodes it owns (its partition's edges, with sources in global ids). A
layer's frontier is then sampled in one request-reply round (:mod:`commgnn.distributed.request`):
frontier nodes go to their owners, each owner draws up to ``fanout`` in-neighbours per
node from its own CSR, and the answers come back as a fixed-width ``[m, fanout]`` table of
global ids, ``-1`` where a node has fewer neighbours. The ids out and the table back are
counted as ``topology`` traffic, the round's time as ``sample``.

A node a rank owns is sampled locally with the same rule. The draws come from the owner's
generator, so one seed per rank fixes every sample of the run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.distributed.request import request_reply
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import sample_neighbors


class RemoteNeighbors:
    """A :data:`~commgnn.sampling.neighbor.NeighborSource` over a partitioned topology."""

    def __init__(self, ctx: DistContext, hooks: Hooks, *, own_csr: CSRTopology, owner: Tensor, row: Tensor,
                 replace: bool, generator: torch.Generator, group: dist.ProcessGroup | None = None) -> None:
        """``own_csr``: in-edges of this rank's nodes, targets numbered by their row here
        (``num_nodes = n_own``), sources in global ids; ``owner [N]`` / ``row [N]``: every
        node's owner rank and row on it; ``generator``: this rank's sampling stream (it
        serves the requests of every asker)."""
        self.ctx, self.hooks, self.group = ctx, hooks, group
        self.csr, self.owner, self.row, self.replace = own_csr, owner, row, replace
        self.gen = generator

    def __call__(self, nodes: Tensor, fanout: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``(src [e] global ids, pos [e] into nodes)`` grouped by pos; one collective round
        (entered even with no nodes: every rank takes part in every round)."""
        if fanout < 0:
            raise ValueError("a partitioned topology needs a positive fan-out per layer")
        nodes = nodes.to(torch.int64)

        def serve(rows: Tensor) -> Tensor:
            src, pos = sample_neighbors(self.csr, rows.to(torch.int64), fanout, self.gen, replace=self.replace)
            table = torch.full((rows.numel(), fanout), -1, dtype=torch.int64)
            if pos.numel():
                first = torch.searchsorted(pos, pos, right=False)  # start of each pos's run
                table[pos, torch.arange(pos.numel()) - first] = src
            return table

        table = request_reply(self.ctx, self.hooks, self.owner[nodes], self.row[nodes].to(torch.int64), serve,
                              req_kind="topology", rep_kind="topology", group=self.group)
        pos, slot = (table >= 0).nonzero(as_tuple=True)
        return table[pos, slot], pos
