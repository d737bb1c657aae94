"""The topology samplers read: in-neighbour lists in CSR, global node ids.

For node v, ``indices[indptr[v]:indptr[v + 1]]`` are the sources u of the edges u -> v,
ascending. Built with one stable sort (no per-node loop). ``indices`` is int32 when the
node count allows (half the memory of int64 at 20M edges: 80 MB instead of 160 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class CSRTopology:
    """In-neighbour CSR of a directed graph on ``num_nodes`` nodes."""

    indptr: Tensor
    """``[N + 1]`` int64 offsets into ``indices``."""
    indices: Tensor
    """``[E]`` int32 or int64 source ids, grouped by target, ascending within a target."""

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel()) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def in_degree(self) -> Tensor:
        """``[N]`` int64 in-degree of every node."""
        return self.indptr[1:] - self.indptr[:-1]

    def nbytes(self) -> int:
        return self.indptr.numel() * self.indptr.element_size() + self.indices.numel() * self.indices.element_size()

    @staticmethod
    def from_edge_index(edge_index: Tensor, num_nodes: int) -> "CSRTopology":
        """From ``[2, E]`` (row 0 source, row 1 target) edges; targets lie in ``[0, num_nodes)``,
        sources may be any ids (a rank's own in-edges come from nodes of the whole graph)."""
        return CSRTopology.from_pairs(edge_index[0], edge_index[1], num_nodes)

    @staticmethod
    def from_pairs(src: Tensor, dst: Tensor, num_nodes: int) -> "CSRTopology":
        """From the sources ``[E]`` and targets ``[E]`` of the edges, as :meth:`from_edge_index`.

        Memory: one int64 key per edge, ``dst * span + src``, sorted in place (numpy's
        in-place sort keeps no index array beside it), then reduced to the source in place:
        about 8 bytes an edge besides the inputs and the result, where a sort with indices
        and the gathers after it took 32 (four ranks building their CSRs of 56M in-edges at
        once on the 10M-node graph ran out of 20 GB)."""
        span = max(num_nodes, int(src.max()) + 1 if src.numel() else 1)
        key = dst.to(torch.int64) * span  # a new tensor, whatever dst's dtype
        key += src
        k = key.numpy()
        k.sort()  # in place (introsort): equal keys are equal edges, so no order among them matters
        counts = torch.bincount(dst.to(torch.int64), minlength=num_nodes)
        indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        key.remainder_(span)  # the sources, in target-then-source order
        small = span < 2**31 - 1
        return CSRTopology(indptr=indptr, indices=key.to(torch.int32) if small else key)

    @staticmethod
    def from_local_csr(indptr: Tensor, local_src: Tensor, ids: Tensor, *, chunk_edges: int = 1 << 22) -> "CSRTopology":
        """The CSR of :meth:`from_pairs` for a rank's in-edges given as a CSR over its rows
        whose sources are local rows: ``indptr [n + 1]`` int64, ``local_src [E]`` (any integer
        dtype, memory-mapped or not) and ``ids``, the global id of every local row. The same
        arrays as ``from_pairs(ids[local_src], targets, n)``, built ``chunk_edges`` edges of
        whole rows at a time straight into the result (which is int32 where ids fit): no
        ``[E]`` int64 temporary (4 GB a rank at 250M in-edges, with the sort's key beside it)."""
        n, E = int(indptr.numel()) - 1, int(local_src.numel())
        span = max(n, int(ids.max()) + 1 if ids.numel() else 1)
        if E:  # from_pairs sizes its ids by the sources used, not by every local row
            used = torch.zeros(ids.numel(), dtype=torch.bool)
            for a in range(0, E, chunk_edges):
                used[local_src[a:a + chunk_edges].to(torch.int64)] = True
            span = max(n, int(ids[used].max()) + 1)
        small = span < 2**31 - 1
        out = torch.empty(E, dtype=torch.int32 if small else torch.int64)
        ptr = indptr.numpy()
        a = 0
        while a < n:  # rows [a, b) holding about chunk_edges edges (at least one row)
            b = max(a + 1, min(n, int(np.searchsorted(ptr, ptr[a] + chunk_edges, side="right")) - 1))
            lo, hi = int(ptr[a]), int(ptr[b])
            if hi > lo:
                rows = torch.repeat_interleave(torch.arange(b - a), torch.from_numpy(np.diff(ptr[a:b + 1])))
                key = rows * span + ids[local_src[lo:hi].to(torch.int64)]
                key = torch.sort(key).values  # rows stay in order; sources ascending within each
                out[lo:hi] = key.remainder_(span).to(out.dtype)
            a = b
        return CSRTopology(indptr=indptr.clone(), indices=out)

    def neighbours_of(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """All in-edges of ``nodes``: ``(src [e] int64 global ids, pos [e] int64 index into
        nodes)``, grouped by position, vectorised (a gather over the concatenated ranges)."""
        nodes = nodes.to(torch.int64)
        start, end = self.indptr[nodes], self.indptr[nodes + 1]
        deg = end - start
        pos = torch.repeat_interleave(torch.arange(nodes.numel()), deg)
        offs = torch.arange(int(deg.sum())) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg)
        return self.indices[start[pos] + offs].to(torch.int64), pos
