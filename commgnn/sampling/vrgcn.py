"""VR-GCN's sampler (Chen, Zhu and Song, ICML 2018): few sampled neighbours plus the full
neighbourhood of the *historical* activations, as a control variate.

For layer l >= 1 and a destination v with in-neighbours N(v) (degree d_v), k sampled::

    agg_v = (1/k) sum_{u in sample} (h_u - hbar_u)  +  (1/d_v) sum_{u in N(v)} hbar_u

Its expectation over the sample is the exact mean ``(1/d_v) sum_{u in N(v)} h_u`` whatever
``hbar`` is, and its variance shrinks as ``hbar`` (the activations from the last time u was
computed) approaches ``h``: fan-out 2 gets close to full-batch accuracy. The history term
needs no feature rows, only the history table and the full in-neighbour lists, which
come from the replicated CSR or, on a partitioned topology, from their owners
(:class:`~commgnn.sampling.remote_edges.RemoteInEdges`, one round per block). Layer 0's history is the input itself (it never changes),
so its aggregate is exact and precomputed once (``[x | mean_N x]`` rows are fetched
instead of ``x``): layer 0 takes no sample and its block is the identity.

A batch is a neighbour-sampled batch of L-1 layers (``fanouts[:L-1]``; the input layer's
fan-out is unused) with an identity block prepended, and for every block l >= 1 the
full in-edges of its destinations (``history_edges``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import torch
from torch import Tensor

from commgnn.sampling.base import Block, MiniBatch
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import NeighborSampler, NeighborSource


class InEdges(Protocol):
    """Where the full in-edge lists come from: a :class:`CSRTopology`, or
    :class:`~commgnn.sampling.remote_edges.RemoteInEdges` over a partitioned topology."""

    def in_degree(self) -> Tensor: ...

    def neighbours_of(self, nodes: Tensor) -> tuple[Tensor, Tensor]: ...


@dataclass
class HistoryEdges:
    """All in-edges of a block's destinations: ``weight_e = 1 / d_v``."""

    src: Tensor
    """``[e]`` int64 global ids of the sources (rows of the history table)."""
    dst: Tensor
    """``[e]`` int64 destination positions in ``[0, num_dst)``."""
    weight: Tensor
    """``[e]`` float64."""


@dataclass
class VRBatch(MiniBatch):
    """A VR-GCN batch: ``blocks[0]`` is the identity; ``history_edges[l]`` for l >= 1."""

    history_edges: list[HistoryEdges | None] = field(default_factory=list)


class VRGCNSampler:
    """Neighbour sampling with fan-outs ``fanouts[:L-1]`` and the full history neighbourhoods."""

    def __init__(self, csr: CSRTopology | InEdges, source: NeighborSource, seeds: Tensor, fanouts: Sequence[int],
                 batch_size: int) -> None:
        """``csr``: every node's in-edges (the history neighbourhoods); ``source``: where the
        sampled neighbours come from."""
        self.csr = csr
        self.num_layers = len(fanouts)
        self.inner = NeighborSampler(source, seeds, list(fanouts[: self.num_layers - 1]), batch_size)
        self.deg = csr.in_degree().clamp(min=1).to(torch.float64)

    def num_batches(self) -> int:
        return self.inner.num_batches()

    def epoch(self, steps: int, generator: torch.Generator) -> Iterator[VRBatch]:
        for batch in self.inner.epoch(steps, generator):
            yield self.extend(batch)

    def sample(self, seeds: Tensor, generator: torch.Generator) -> VRBatch:
        return self.extend(self.inner.sample(seeds, generator))

    def extend(self, batch: MiniBatch) -> VRBatch:
        """Prepend the identity block and add the full in-edges of every sampled block."""
        n0 = int(batch.nodes.numel())
        ident = Block(edge_index=torch.zeros(2, 0, dtype=torch.long), num_src=n0, num_dst=n0,
                      weight=torch.zeros(0, dtype=torch.float64))
        hist: list[HistoryEdges | None] = [None]
        for block in batch.blocks:
            dst_nodes = batch.nodes[: block.num_dst]
            src, pos = self.csr.neighbours_of(dst_nodes)
            hist.append(HistoryEdges(src=src, dst=pos, weight=1.0 / self.deg[dst_nodes[pos]]))
        return VRBatch(nodes=batch.nodes, blocks=[ident, *batch.blocks], target=batch.target,
                       target_weight=batch.target_weight, history_edges=hist)
