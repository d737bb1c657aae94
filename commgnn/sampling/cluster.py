"""Cluster-GCN (Chiang et al. 2019) on one rank's own nodes.

Once, at construction, METIS splits the subgraph induced by the rank's ``n`` own nodes
into ``c`` clusters (k-way, symmetrised, self loops dropped, seeded). An epoch permutes the
cluster ids and cuts them into ``steps`` chunks (:func:`split_evenly`); a batch merges the
clusters of one chunk (Chiang et al.'s "multiple clusters per batch") and keeps *every*
edge ``u -> v`` of the graph with both ends among the merged nodes, including the edges
between different clusters, which restores some of the links the partition cut.

A batch of ``b`` nodes is one square graph used by every layer::

    nodes:       [b] int64 sorted global ids of the merged clusters
    edge_index:  [2, e] local (searchsorted) ids, grouped by destination
    weight_e = 1 / deg_in_batch(dst(e))     (a mean over the kept in-edges)
    target:      positions of the training nodes among ``nodes``

so ``num_src = num_dst = b`` in all ``num_layers`` blocks. Every cluster lands in exactly
one chunk per epoch, so every own node is in exactly one batch.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pymetis
import torch
from torch import Tensor

from commgnn.errors import PartitionError
from commgnn.partition.metis import symmetric_csr
from commgnn.sampling.base import Block, MiniBatch, empty_batch, split_evenly
from commgnn.sampling.csr import CSRTopology


def _members(sorted_ids: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
    """``(idx, found)``: each query's index in the ascending ``sorted_ids`` and whether it
    is there at all (a binary search, no buffer the size of the graph)."""
    n = int(sorted_ids.numel())
    if n == 0:
        return torch.zeros_like(query), torch.zeros(query.shape, dtype=torch.bool)
    idx = torch.searchsorted(sorted_ids, query)
    found = sorted_ids[idx.clamp(max=n - 1)] == query
    return idx, found & (idx < n)


def _contiguous_clusters(n: int, k: int) -> Tensor:
    """``[n]`` cluster ids cutting ``0..n-1`` into ``k`` contiguous runs of near-equal size."""
    return torch.arange(n, dtype=torch.int64) * k // max(n, 1)


def _metis_clusters(edge_index: Tensor, n: int, k: int, seed: int) -> Tensor:
    """``[n]`` METIS k-way cluster ids of the ``n``-node local graph ``edge_index``."""
    xadj, adjncy = symmetric_csr(edge_index, n)
    idx = pymetis.zero_copy_dtype()
    adjacency = pymetis.CSRAdjacency(np.ascontiguousarray(xadj.numpy(), dtype=idx),
                                     np.ascontiguousarray(adjncy.numpy(), dtype=idx))
    # k-way always, as in commgnn.partition.metis (pymetis picks recursive bisection for
    # k <= 8 otherwise); the seed makes the clustering repeatable.
    options = pymetis.Options(seed=int(seed))
    try:
        result = pymetis.part_graph(k, adjacency, recursive=False, options=options)
    except (RuntimeError, MemoryError) as exc:
        raise PartitionError(f"METIS failed to split {n} nodes into {k} clusters: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    return torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int64).copy())


class ClusterSampler:
    """Cluster-GCN (Chiang et al. 2019) on one rank's own nodes: METIS splits the subgraph
    induced by own_nodes into num_clusters clusters once; a batch merges clusters_per_batch
    random clusters and keeps every edge among the merged nodes (including edges between
    different clusters)."""

    num_layers: int
    """Layers of every batch (all share the batch's one graph)."""

    def __init__(self, csr: CSRTopology, own_nodes: Tensor, train_mask: Tensor, *, num_layers: int,
                 num_clusters: int, clusters_per_batch: int, seed: int) -> None:
        """``own_nodes``: ``[n]`` int64 ascending global ids of this rank's nodes;
        ``train_mask``: ``[n]`` bool aligned with ``own_nodes``. ``num_clusters`` is clamped
        to ``n`` (a rank without nodes has no clusters and no batches of its own)."""
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if num_clusters < 1 or clusters_per_batch < 1:
            raise ValueError(f"num_clusters and clusters_per_batch must be >= 1, got "
                             f"{num_clusters} and {clusters_per_batch}")
        own_nodes = own_nodes.to(torch.int64).flatten()
        train_mask = train_mask.to(torch.bool).flatten()
        n = int(own_nodes.numel())
        if train_mask.numel() != n:
            raise ValueError(f"train_mask has {train_mask.numel()} entries for {n} own nodes")
        if n > 1 and bool((own_nodes[1:] <= own_nodes[:-1]).any()):
            raise ValueError("own_nodes must be strictly ascending")
        self.csr = csr
        """The graph (in-neighbour lists, global ids)."""
        self.own_nodes = own_nodes
        """``[n]`` int64 ascending global ids of this rank's nodes."""
        self.train_mask = train_mask
        """``[n]`` bool: which own nodes are training nodes (the batch targets)."""
        self.num_layers = int(num_layers)
        self.num_clusters = min(int(num_clusters), n)
        """Clusters actually made (``min(num_clusters, n)``)."""
        self.clusters_per_batch = int(clusters_per_batch)
        """Clusters merged into one batch."""
        self.cluster = self._cluster(n, int(seed))
        """``[n]`` int64 cluster id of every own node (METIS may leave some cluster empty)."""
        # Own nodes grouped by cluster, ascending within each (stable sort), plus offsets:
        # a batch gathers its clusters' ranges without scanning all n nodes.
        self._by_cluster = torch.sort(self.cluster, stable=True).indices
        counts = torch.bincount(self.cluster, minlength=self.num_clusters)
        self._ptr = torch.zeros(self.num_clusters + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=self._ptr[1:])

    def _cluster(self, n: int, seed: int) -> Tensor:
        """METIS clusters of the induced subgraph; contiguous chunks when METIS has nothing
        to do (one cluster, a cluster per node) or nothing to go on (no internal edges)."""
        k = self.num_clusters
        if k <= 1 or k >= n:
            return _contiguous_clusters(n, k)
        src, pos = self.csr.neighbours_of(self.own_nodes)
        local_src, inside = _members(self.own_nodes, src)
        edge_index = torch.stack([local_src[inside], pos[inside]])
        if not bool((edge_index[0] != edge_index[1]).any()):
            return _contiguous_clusters(n, k)
        return _metis_clusters(edge_index, n, k, seed)

    def num_batches(self) -> int:
        """``ceil(num_clusters / clusters_per_batch)`` (0 for a rank without nodes)."""
        return -(-self.num_clusters // self.clusters_per_batch)

    def epoch(self, steps: int, generator: torch.Generator) -> Iterator[MiniBatch]:
        """Exactly ``steps`` batches: the cluster ids in a random order (from ``generator``)
        cut by :func:`split_evenly`; an empty chunk gives :func:`empty_batch`."""
        if steps < 0 or (steps == 0 and self.num_clusters > 0):
            raise ValueError(f"cannot cover {self.num_clusters} clusters in {steps} steps")
        if steps == 0:
            return
        perm = torch.randperm(self.num_clusters, generator=generator)
        for chunk in split_evenly(perm, steps):
            yield empty_batch(self.num_layers) if chunk.numel() == 0 else self.batch(chunk)

    def batch(self, clusters: Tensor) -> MiniBatch:
        """The batch merging ``clusters`` (``[c]`` int64 distinct cluster ids)."""
        clusters = clusters.to(torch.int64)
        start = self._ptr[clusters]
        size = self._ptr[clusters + 1] - start
        # Concatenated ranges [start_j, start_j + size_j), the gather of CSRTopology.neighbours_of.
        which = torch.repeat_interleave(torch.arange(clusters.numel()), size)
        offs = torch.arange(int(size.sum())) - torch.repeat_interleave(torch.cumsum(size, 0) - size, size)
        local = torch.sort(self._by_cluster[start[which] + offs]).values
        nodes = self.own_nodes[local]  # ascending, since own_nodes is
        b = int(nodes.numel())
        src, dst = self.csr.neighbours_of(nodes)
        src_local, inside = _members(nodes, src)
        src_local, dst = src_local[inside], dst[inside]  # still grouped by destination
        in_count = torch.bincount(dst, minlength=b)
        weight = 1.0 / in_count[dst].to(torch.float64)
        edge_index = torch.stack([src_local, dst])
        # One graph for every layer: separate Block objects over the same tensors.
        blocks = [Block(edge_index=edge_index, num_src=b, num_dst=b, weight=weight)
                  for _ in range(self.num_layers)]
        target = self.train_mask[local].nonzero().flatten()
        return MiniBatch(nodes=nodes, blocks=blocks, target=target)
