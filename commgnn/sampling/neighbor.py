"""GraphSAGE neighbour sampling (Hamilton et al. 2017), vectorised.

One batch grows outward from its seeds, one hop per layer. With ``k`` current nodes
``V = [v_0 .. v_{k-1}]`` (global ids) and fan-out ``f``, the source draws for every v_i up
to ``f`` of its in-neighbours, giving edges ``(src [e] global, pos [e] index into V)``
grouped by ``pos``. The next node list is ``V`` followed by the newly reached nodes, in the
order of their first appearance among the sampled sources, so ``V`` stays a prefix (the
block's destinations are its first ``k`` sources). The layer's :class:`Block` is
``edge_index = [local(src), pos]`` with ``num_dst = k``, ``num_src = len(next list)`` and
``weight_e = 1 / #sampled in-edges of pos(e)`` (a mean over what was kept).

``fanouts[0]`` is hop 1 from the seeds, which feeds the *last* layer (the order of PyG
``NeighborLoader``'s ``num_neighbors``); the blocks are reversed at the end so that
``MiniBatch.blocks`` lists the input layer first.

Without replacement, node v of in-degree ``d > f`` keeps a uniformly random set of exactly
``f`` distinct edge slots, drawn by Floyd's algorithm (Bentley & Floyd 1987) vectorised over
the nodes: step ``i = 0 .. f-1`` draws ``t`` uniform on ``[0, d-f+i]`` and keeps ``t``, or
``d-f+i`` when ``t`` was already kept, so every f-subset is equally likely. The cost is
``O(f^2)`` per node whatever its degree: a power-law hub of a million in-edges costs what
a node of ``f`` does (gathering every in-edge and shuffling them, as before, made the rank
that owns the hubs the straggler of every distributed sampling round). Nodes of degree
``<= f`` keep all their edges. With replacement, every node with ``d > 0`` gets exactly
``f`` independent uniform draws (duplicates kept). All randomness comes from the caller's
``torch.Generator``, so the same generator state gives the same sample.

The neighbour lookup is a :data:`NeighborSource`. :func:`replicated_source` reads a full
local :class:`CSRTopology`; a distributed source (neighbours of remote nodes fetched from
their owners) runs a collective inside, which is why :meth:`NeighborSampler.sample` calls
the source exactly once per layer even for an empty batch.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from commgnn.sampling.base import Block, MiniBatch, split_evenly
from commgnn.sampling.csr import CSRTopology

NeighborSource = Callable[[Tensor, int, torch.Generator], tuple[Tensor, Tensor]]
"""(nodes [n] int64 global ids, fanout, generator) -> (src [e] int64 global ids, pos [e]
int64 index into nodes, sorted ascending)."""


def _empty_edges() -> tuple[Tensor, Tensor]:
    e = torch.zeros(0, dtype=torch.int64)
    return e, e.clone()


def sample_neighbors(csr: CSRTopology, nodes: Tensor, fanout: int, generator: torch.Generator, *,
                     replace: bool = False) -> tuple[Tensor, Tensor]:
    """For each node, up to `fanout` of its in-neighbours. fanout < 0: all of them. Without
    replacement: all neighbours when degree <= fanout, else a uniform random subset of
    exactly `fanout` distinct edge slots. With replacement: exactly `fanout` uniform draws
    (duplicates kept) for every node of degree > 0. Returns (src, pos) as in
    NeighborSource, grouped by pos."""
    nodes = nodes.to(torch.int64)
    if fanout < 0:
        return csr.neighbours_of(nodes)
    if fanout == 0 or nodes.numel() == 0:
        return _empty_edges()
    start = csr.indptr[nodes]
    deg = csr.indptr[nodes + 1] - start
    if replace:
        count = torch.where(deg > 0, fanout, 0)
        pos = torch.repeat_interleave(torch.arange(nodes.numel()), count)
        d = deg[pos]
        # floor(u * d) with u uniform in [0, 1) is uniform on {0 .. d-1}; float64 keeps the
        # bias negligible for any realistic degree, the clamp guards the rounding edge.
        u = torch.rand(pos.numel(), generator=generator, dtype=torch.float64)
        offs = torch.minimum((u * d).to(torch.int64), d - 1)
        return csr.indices[start[pos] + offs].to(torch.int64), pos
    heavy = deg > fanout
    if not bool(heavy.any()):
        return csr.neighbours_of(nodes)  # nobody has more than `fanout` candidates: keep everything
    light = (~heavy).nonzero().flatten()
    big = heavy.nonzero().flatten()
    src_l, pos_l = csr.neighbours_of(nodes[light])
    offs = _floyd_subsets(deg[big], fanout, generator)  # [h, fanout]
    src_h = csr.indices[start[big][:, None] + offs].flatten().to(torch.int64)
    pos = torch.cat([light[pos_l], big.repeat_interleave(fanout)])
    order = torch.sort(pos, stable=True).indices  # grouped by node again
    return torch.cat([src_l, src_h])[order], pos[order]


def _floyd_subsets(deg: Tensor, fanout: int, generator: torch.Generator) -> Tensor:
    """``[h, fanout]`` int64 distinct offsets in ``[0, deg_i)`` per row, each row a uniform
    random ``fanout``-subset: Floyd's algorithm, one vectorised step per slot (every
    ``deg_i > fanout``). Written by hand: torch has no batched sampling without replacement
    over rows of different lengths (``multinomial`` needs a dense ``[h, max deg]`` table)."""
    h = int(deg.numel())
    chosen = torch.empty((h, fanout), dtype=torch.int64)
    u = torch.rand((fanout, h), generator=generator, dtype=torch.float64)
    for i in range(fanout):
        j = deg - fanout + i  # step i draws from [0, j]
        t = torch.minimum((u[i] * (j + 1)).to(torch.int64), j)  # float64: unbiased, clamp: rounding
        if i:
            t = torch.where((chosen[:, :i] == t[:, None]).any(1), j, t)
        chosen[:, i] = t
    return chosen


def replicated_source(csr: CSRTopology, replace: bool) -> NeighborSource:
    """A :data:`NeighborSource` reading a full local copy of the topology through
    :func:`sample_neighbors` (no communication)."""

    def source(nodes: Tensor, fanout: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return sample_neighbors(csr, nodes, fanout, generator, replace=replace)

    return source


def _relabel(current: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
    """``(next_nodes, local_src)``: ``current`` (distinct ids) followed by the new ids of
    ``src`` in order of first appearance, and every ``src`` entry's index in that list.

    ``unique`` sorts, so the first-occurrence position of each unique id (a scatter-min
    over its occurrences in ``cat([current, src])``) restores the wanted order; it never
    allocates anything of the size of the whole graph."""
    combined = torch.cat([current, src])
    uniq, inverse = torch.unique(combined, return_inverse=True)
    first = torch.full((uniq.numel(),), combined.numel(), dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, torch.arange(combined.numel()), reduce="amin")
    order = torch.argsort(first)  # first positions are distinct: the order is unambiguous
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    local = rank[inverse]
    # ``current`` is distinct, so its entries get ranks 0..k-1 in place (the prefix property).
    return uniq[order], local[current.numel():]


class NeighborSampler:
    """GraphSAGE neighbour sampling: per-layer fan-outs (fanouts[0] = hop 1 from the seeds,
    the LAST layer's block; PyG NeighborLoader's num_neighbors order)."""

    num_layers: int
    """Layers of every batch (``len(fanouts)``)."""

    def __init__(self, source: NeighborSource, seeds: Tensor, fanouts: Sequence[int],
                 batch_size: int) -> None:
        """``seeds``: ``[s]`` int64 distinct global ids of this rank's training nodes;
        ``fanouts``: per hop, negative for all neighbours; ``batch_size`` >= 1."""
        if len(fanouts) == 0:
            raise ValueError("NeighborSampler needs at least one fan-out (one layer)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.source = source
        """Where neighbours come from (local CSR or a distributed fetch)."""
        self.seeds = seeds.to(torch.int64).flatten()
        """``[s]`` int64 global ids of the seeds."""
        self.fanouts = [int(f) for f in fanouts]
        """Fan-out per hop, hop 1 first."""
        self.batch_size = int(batch_size)
        """Seeds per batch when the rank runs alone (see :meth:`num_batches`)."""
        self.num_layers = len(self.fanouts)

    def num_batches(self) -> int:
        """``ceil(len(seeds) / batch_size)``; 0 when there are no seeds."""
        return -(-int(self.seeds.numel()) // self.batch_size)

    def epoch(self, steps: int, generator: torch.Generator) -> Iterator[MiniBatch]:
        """Exactly ``steps`` batches: the seeds in a random order (from ``generator``) cut by
        :func:`split_evenly`; a rank with fewer seeds than steps gets empty batches, which
        still call the source once per layer."""
        if steps < 0 or (steps == 0 and self.seeds.numel() > 0):
            raise ValueError(f"cannot cover {self.seeds.numel()} seeds in {steps} steps")
        if steps == 0:
            return
        perm = self.seeds[torch.randperm(int(self.seeds.numel()), generator=generator)]
        for chunk in split_evenly(perm, steps):
            yield self.sample(chunk, generator)

    def sample(self, seeds: Tensor, generator: torch.Generator) -> MiniBatch:
        """The batch rooted at ``seeds`` (``[b]`` int64 distinct global ids, possibly empty).
        The source is called once per layer whatever ``b`` is: zero-length tensors flow
        through rather than short-circuiting, so every rank enters the same collectives."""
        current = seeds.to(torch.int64).flatten()
        num_seeds = int(current.numel())
        blocks: list[Block] = []
        for fanout in self.fanouts:
            k = int(current.numel())
            src, pos = self.source(current[:k], fanout, generator)
            src, pos = src.to(torch.int64), pos.to(torch.int64)
            if pos.numel() > 1 and bool((pos[1:] < pos[:-1]).any()):
                # Blocks are sorted by destination; a source that broke the contract is
                # repaired here (stable, so each node's edges keep their order).
                order = torch.sort(pos, stable=True).indices
                src, pos = src[order], pos[order]
            nxt, local_src = _relabel(current, src)
            in_count = torch.bincount(pos, minlength=k)
            weight = 1.0 / in_count[pos].to(torch.float64)
            blocks.append(Block(edge_index=torch.stack([local_src, pos]), num_src=int(nxt.numel()),
                                num_dst=k, weight=weight))
            current = nxt
        blocks.reverse()  # hop 1 feeds the last layer: input layer first
        return MiniBatch(nodes=current, blocks=blocks, target=torch.arange(num_seeds), target_weight=None)
