"""A sampled probe of how many nodes one neighbour-sampling step gathers, for the memory
pre-flight.

:func:`~commgnn.runner.preflight.sampled_per_step` bounds hop ``k``'s nodes by
``c_k = min(N, c_{k-1} (1 + f_k))``: every sampled neighbour counted as new. On a graph
whose batches overlap (a METIS partition's training nodes share most of their
neighbourhoods) the real count is far smaller: on Coauthor Physics on 8 ranks at batch 512
and fan-out 15,10 the bound is every one of the 34,493 nodes, a step gathers at most 10-11k,
and the pre-flight refused the run (36.4 GB estimated) that peaked at 1.6 GB a rank.

The probe runs the trainer's own :class:`~commgnn.sampling.neighbor.NeighborSampler` on the
launcher's copy of the topology for a few batches per rank, each of the size the trainer
will give that rank (its training nodes over the rank-wide step count, see
:func:`~commgnn.sampling.base.split_evenly`), and returns each hop's largest node count.
The pre-flight scales that by :data:`PROBE_MARGIN` and keeps the analytic bound as a cap.
The launcher probes only a run that the bound refuses (building the probe's CSR costs
about as much as the graph's edges).

The topology comes from the graph the launcher loaded, or, for a saved partition
directory (where the launcher may not load the graph at all), from the partition files'
own in-edges, read one file at a time: the union of every rank's in-edges is the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from commgnn.partition import load_partition
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import NeighborSampler, replicated_source
from commgnn.trainers.mb_setup import own_in_edges

PROBE_BATCHES = 4
"""Batches probed per rank: the largest hop count over them is kept (batches of one
partition's training nodes vary by a few percent, see the tests)."""
PROBE_MARGIN = 1.5
"""Factor on the probed hop counts; the analytic bound still caps the product. It covers a
batch larger than any probed one (a few percent), and the step terms' constants
(``BATCH_FEATURE_COPIES``, ``ACTIVATION_COPIES``), fitted while the step sizes were the
overlap-free bound (the fit that chose 1.5 is on the docs' results pages)."""


@dataclass
class ProbeGraph:
    """What the probe reads: the whole in-neighbour topology and each rank's seeds."""

    csr: CSRTopology
    """In-neighbour CSR over the whole graph's global ids."""
    seeds: list[Tensor]
    """Per rank, ``[s_r]`` int64 global ids of its training nodes."""


def probe_graph_from_data(data: Any, parts: Tensor, num_parts: int) -> ProbeGraph:
    """From the loaded graph (``data.edge_index``, ``data.train_mask``) and the part id of
    every node (``[N]``)."""
    csr = CSRTopology.from_edge_index(data.edge_index, int(data.num_nodes))
    train = data.train_mask.to(torch.bool)
    seeds = [torch.nonzero(train & (parts == r)).flatten() for r in range(num_parts)]
    return ProbeGraph(csr=csr, seeds=seeds)


def probe_graph_from_dir(part_dir: str, num_parts: int) -> ProbeGraph:
    """From a saved partition directory: every rank's own in-edges (local ids mapped to
    global), one file in memory at a time."""
    edges, seeds, num_nodes = [], [], 0
    for r in range(num_parts):
        lp = load_partition(part_dir, r, expected_parts=num_parts)
        edges.append(own_in_edges(lp))  # the in-edges the trainer's replicated topology gathers
        seeds.append(lp.global_ids[lp.train_mask].to(torch.int64))
        num_nodes = lp.num_nodes_global
        del lp
    return ProbeGraph(csr=CSRTopology.from_edge_index(torch.cat(edges, dim=1), num_nodes), seeds=seeds)


def probe_hops(graph: ProbeGraph, *, fanout: Sequence[int], batch_size: int, replace: bool = False,
               batches: int = PROBE_BATCHES, seed: int = 0) -> list[tuple[int, ...]]:
    """Per rank, the largest node count after each hop over ``batches`` sampled batches:
    ``(c_1, ..., c_K)`` for ``K = len(fanout)`` (``c_0``, the batch, is known). A rank's
    batch has ``ceil(s_r / steps)`` seeds, where ``steps = ceil(max_r s_r / batch_size)``
    is the count every rank runs; a rank without seeds gets zeros."""
    source = replicated_source(graph.csr, replace)
    samplers = [NeighborSampler(source, seeds, fanout, batch_size) for seeds in graph.seeds]
    steps = max(max((s.num_batches() for s in samplers), default=0), 1)  # what every rank runs
    gen = torch.Generator().manual_seed(seed)
    out: list[tuple[int, ...]] = []
    for sampler, seeds in zip(samplers, graph.seeds):
        size = -(-int(seeds.numel()) // steps)
        if size == 0:
            out.append((0,) * len(fanout))
            continue
        best = [0] * len(fanout)
        for _ in range(batches):
            batch = seeds[torch.randperm(int(seeds.numel()), generator=gen)[:size]]
            mb = sampler.sample(batch, gen)
            # blocks are listed input layer first; hop k's block has c_k sources
            for k, block in enumerate(reversed(mb.blocks)):
                best[k] = max(best[k], block.num_src)
        out.append(tuple(best))
    return out
