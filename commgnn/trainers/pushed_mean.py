"""The input layer's mean over full in-neighbourhoods, summed where the features lie.

Layer-wise inference at chosen nodes (:func:`commgnn.trainers.layerwise.layerwise_forward`
with ``targets``) needs, for the first layer, the mean of the feature rows of every
in-neighbour of ``need[1]``, the rows the second layer reads. On a power-law graph those
rows are the hubs' neighbourhoods: on the papers100M-shaped graph, 20,000 test nodes reach
53,320 rows on one rank at layer 1, with 750 in-edges each on average, whose sources
cover most of the graph's 25.6 GB ``x.npy``. Pulled chunk by chunk, every chunk of 1M
in-edges re-reads a scattered share of that file (39 passes over it). Pushed, each owner
reads its rows once, in file order, and sends sums::

    each rank r:   pairs (row on owner q, slot of r's destination) for its in-edges
                   of need[1]                                   -> owner q   (8 bytes a pair)
    each owner q:  sort the pairs it got by row; stream its rows in file order, block
                   by block;  acc[r][slot] += x[row]           [sum_r m_r, F] float
                   send acc[r] back                             -> rank r    (4F bytes a row)
    each rank r:   mean = sum_q acc_q[r] / in-degree            [m_r, F]

in groups of at most :data:`PUSH_EDGES` in-edges a rank (every rank the same number of
rounds), so that a group's pairs stay bounded. The mean is linear, so GraphSAGE's first
layer is then ``lin_l(mean) + lin_r(x_dst)`` (``from_precomputed``), the full-graph
forward's value up to summation order. Written here: the pull-based layer-wise inference
of DGL and PyG reads each chunk's sources, which is what this replaces.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.distributed.request import all_to_all

PUSH_EDGES = 1 << 24
"""In-edges a rank pushes in one group: 16M pairs (128 MB of int32 pairs, with their sort
and the owner's copy about 0.7 GB a rank at its peak)."""
READ_ROWS = 1 << 20
"""Feature rows an owner reads and adds at a time (256 MB of float16 rows of 128)."""


def _groups(deg: Tensor, budget: int) -> list[tuple[int, int]]:
    """``[a, b)`` ranges of destination positions with at most ``budget`` in-edges each
    (a row with more has its own)."""
    if deg.numel() == 0:
        return []
    before = torch.cumsum(deg, 0) - deg
    key = before // budget
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(key[1:] != key[:-1]).flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([deg.numel()])])
    return list(zip(starts.tolist(), ends.tolist()))


@torch.no_grad()
def pushed_mean(ctx: DistContext, hooks: Hooks, ptr: Tensor, in_edges: Callable[[Tensor], tuple[Tensor, Tensor]],
                x: Tensor, dst: Tensor,
                halo_owner: Tensor, halo_row: Tensor, n_own: int, dtype: torch.dtype,
                budget: int = PUSH_EDGES) -> Tensor:
    """``[m, F]`` (``dtype``) mean of the feature rows of the in-neighbours of the owned rows
    ``dst [m]`` (0 for a row without in-edges), the sums made by the rows' owners (module
    docstring). ``ptr`` / ``in_edges``: this rank's in-CSR (``in_edges(rows)`` gives their
    in-edges' sources, local ids: owned, then halo, and each edge's position in ``rows``); ``x [n_own, F]`` its feature rows; ``halo_owner``
    / ``halo_row``: each halo row's owner and its row there. All ranks call it together."""
    P, me = ctx.world_size, ctx.rank
    F = int(x.shape[1])
    deg = (ptr[dst + 1] - ptr[dst]).to(torch.int64)
    out = torch.zeros((dst.numel(), F), dtype=dtype)
    groups = _groups(deg, budget)
    rounds = len(groups)
    if ctx.is_distributed:
        rounds = int(ctx.all_reduce(torch.tensor([float(rounds)], dtype=torch.float64), "max")[0])
    groups += [(dst.numel(), dst.numel())] * (rounds - len(groups))
    for a, b in groups:
        src, pos = in_edges(dst[a:b])
        local = src < n_own
        halo = src[~local] - n_own
        owner = torch.cat([torch.full((int(local.sum()),), me, dtype=torch.int64), halo_owner[halo].to(torch.int64)])
        pairs = torch.stack([torch.cat([src[local], halo_row[halo]]), torch.cat([pos[local], pos[~local]])], 1)
        del src, pos, local, halo
        order = torch.sort(owner, stable=True).indices
        counts = torch.bincount(owner, minlength=P)
        pairs = pairs[order].to(torch.int32)
        del order, owner
        m = b - a
        if ctx.is_distributed:
            in_counts = all_to_all(ctx, None, counts, [1] * P, [1] * P).tolist()
            got = all_to_all(ctx, None, pairs, counts.tolist(), in_counts)
            sizes = ctx.all_gather(torch.tensor([m], dtype=torch.int64))[:, 0]
            for q in range(P):
                if q != me:
                    hooks.sent("halo_eval", -1, q, 8 + int(counts[q]) * 8)
        else:
            in_counts, got, sizes = [int(counts[0])], pairs, torch.tensor([m])
        del pairs
        base = torch.cumsum(sizes, 0) - sizes
        slot = base.repeat_interleave(torch.tensor(in_counts)) + got[:, 1].to(torch.int64)
        row = got[:, 0].to(torch.int64)
        del got
        order = torch.sort(row).indices
        row, slot = row[order], slot[order]
        del order
        acc = torch.zeros((int(sizes.sum()), F), dtype=dtype)
        uniq, inv = torch.unique_consecutive(row, return_inverse=True)
        del row
        first = torch.searchsorted(inv, torch.arange(0, uniq.numel() + READ_ROWS, READ_ROWS).clamp(max=uniq.numel()))
        for k, k0 in enumerate(range(0, uniq.numel(), READ_ROWS)):
            e0, e1 = int(first[k]), int(first[k + 1])
            rows = x[uniq[k0:k0 + READ_ROWS]].to(dtype)  # ascending rows: read in file order
            acc.index_add_(0, slot[e0:e1], rows[inv[e0:e1] - k0])
            del rows
        del uniq, inv, slot
        if ctx.is_distributed:
            back = all_to_all(ctx, None, acc, sizes.tolist(), [m] * P)
            for q in range(P):
                if q != me:
                    hooks.sent("halo_eval", -1, q, int(sizes[q]) * F * acc.element_size())
            out[a:b] = back.view(P, m, F).sum(0)
            del back
        else:
            out[a:b] = acc
        del acc
    return out / deg.clamp(min=1).to(dtype)[:, None]
