"""Streaming partitioning: Linear Deterministic Greedy (Stanton and Kliot, KDD 2012), in chunks.

Nodes arrive in id order. Node ``v`` goes to the part holding most of its already placed
neighbours, discounted by how full that part is::

    part(v) = argmax_p  |N(v) ∩ V_p| * (1 - |V_p| / cap)          cap = ceil(N / P) * (1 + slack)

A node with no placed neighbour goes to the emptiest part. Later passes re-stream the
nodes against the previous pass's assignment (:data:`PASSES`). Unlike METIS (whose multilevel
coarsening keeps several copies of the graph), it holds only the symmetric adjacency and
one ``[N]`` assignment, so it is the fallback when METIS would not fit in memory
(``partition.memory_limit_gb``). Its cut is worse than METIS's and better than random's
on graphs with locality.

The stream is processed ``chunk`` nodes at a time: a chunk's nodes see every node placed
before the chunk but not each other, which vectorises the greedy step (one ``index_put_``
per chunk, no per-node Python loop). Nodes a chunk would place past a part's capacity go,
in order of their score, to the parts with room left, so every part ends at most
``cap`` nodes. Written here because no maintained Python library provides a streaming
partitioner that works on a torch edge list.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from commgnn.partition.base import PARTITIONERS

if TYPE_CHECKING:
    from commgnn.partition.config import PartitionConfig

SLACK = 0.05
"""Parts may exceed the mean size by this fraction."""
PASSES = 3
"""Streaming passes: after the first, every node sees all its neighbours' current parts
(restreaming LDG, Nishimura and Ugander, KDD 2013), which cuts markedly fewer edges."""
CHUNK = 4096
"""Nodes placed per vectorised step (at most 5% of a part's capacity, whichever is smaller)."""


@PARTITIONERS.register("ldg")
def ldg_partition(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
    """``[num_nodes]`` int64 part ids from one streaming pass in id order."""
    P = num_parts
    parts = torch.full((num_nodes,), -1, dtype=torch.int64)
    if P == 1:
        return parts.zero_()
    xadj, adjncy = lean_adjacency(edge_index, num_nodes)
    cap = math.ceil(num_nodes / P * (1 + SLACK))
    chunk = max(1, min(CHUNK, cap // 20))
    sizes = torch.zeros(P, dtype=torch.int64)
    for _ in range(PASSES):
        for start in range(0, num_nodes, chunk):
            stop = min(start + chunk, num_nodes)
            b = stop - start
            old = parts[start:stop]
            sizes -= torch.bincount(old[old >= 0], minlength=P)  # restreaming: lift the chunk out first
            nbr = adjncy[xadj[start]:xadj[stop]]
            row = torch.repeat_interleave(torch.arange(b), xadj[start + 1:stop + 1] - xadj[start:stop])
            owner = parts[nbr.long()]
            placed = owner >= 0
            counts = torch.zeros(b, P)
            counts.index_put_((row[placed], owner[placed]), torch.ones(int(placed.sum())), accumulate=True)
            room = 1.0 - sizes.double() / cap
            # Ties (including no placed neighbour) go to the emptiest part: a tiny bonus for room.
            score = counts.double() * room + 1e-6 * room
            score[:, sizes >= cap] = -math.inf
            choice = score.argmax(1)
            best = score.gather(1, choice.view(-1, 1)).view(-1)
            parts[start:stop] = _fit(choice, best, sizes, cap)
    return parts


def lean_adjacency(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``(xadj [N+1] int64, adjncy [2E])``: both directions of every edge grouped by node,
    in int32 where ids fit. Unlike METIS's input, duplicates and self loops stay (a
    duplicate neighbour counts twice in a greedy score, which does no harm), which saves
    the deduplicating sort of 64-bit keys: about half METIS's peak memory per edge."""
    small = num_nodes < 2**31
    dt = torch.int32 if small else torch.int64
    rows = torch.cat([edge_index[0].to(dt), edge_index[1].to(dt)])
    order = torch.sort(rows, stable=True).indices
    counts = torch.bincount(rows, minlength=num_nodes)
    del rows
    cols = torch.cat([edge_index[1].to(dt), edge_index[0].to(dt)])[order]
    del order
    xadj = torch.zeros(num_nodes + 1, dtype=torch.int64)
    xadj[1:] = counts.cumsum(0)
    return xadj, cols


def _fit(choice: Tensor, best: Tensor, sizes: Tensor, cap: int) -> Tensor:
    """Keep each part within ``cap``: per part, its highest-scoring choosers stay, the rest go
    to parts with room (emptiest first). Updates ``sizes`` in place."""
    P = sizes.numel()
    order = torch.argsort(-best, stable=True)
    by_part = choice[order]
    # Rank of each chooser within its part (0 = best score), without a Python loop.
    key = torch.argsort(by_part, stable=True)
    starts = torch.searchsorted(by_part[key], torch.arange(P))
    rank_in = torch.empty_like(key)
    rank_in[key] = torch.arange(key.numel()) - starts[by_part[key]]
    overflow = rank_in >= (cap - sizes)[by_part]
    out = by_part.clone()
    sizes += torch.bincount(by_part[~overflow], minlength=P)
    n_over = int(overflow.sum())
    if n_over:
        free = (cap - sizes).clamp(min=0)
        # Parts with the most room take the overflow first.
        targets = torch.repeat_interleave(torch.argsort(-free, stable=True), free[torch.argsort(-free, stable=True)])
        out[overflow] = targets[:n_over]
        sizes += torch.bincount(targets[:n_over], minlength=P)
    result = torch.empty_like(out)
    result[order] = out
    return result
