"""What every sampler produces, and the Protocol it implements.

A mini-batch is an L-layer computation graph in *batch-local* numbering (the convention of
DGL's blocks and PyG's ``NeighborLoader``). Layer l maps the rows of its input
``h_l: [num_src_l, d]`` to the rows of its output ``h_{l+1}: [num_dst_l, d']``, and the
destinations are a prefix of the sources (destination i is source i), so a layer's root
term reads ``h_l[:num_dst_l]``::

    agg_i = sum_{e: dst(e) = i} weight_e * h_l[src(e)]           agg: [num_dst_l, d]
    h_{l+1} = act(W_l agg + b_l + W_r h_l[:num_dst_l])             (GraphSAGE-mean)

``weight`` carries the sampler's normalisation: ``1 / #sampled in-neighbours`` for
neighbour sampling and Cluster-GCN (a mean over what was kept), GraphSAINT's unbiased
``A_vu / alpha_uv``. ``blocks[l + 1].num_src == blocks[l].num_dst``: each layer's output
rows are the next layer's input rows, and ``nodes[:k]`` are the global ids of the first k
rows at every depth.

Samplers see the graph through :class:`~commgnn.sampling.csr.CSRTopology` (in-neighbour
lists in global ids) and the rank's own seeds; they know nothing of ranks or collectives,
so each one runs unchanged in a single process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class Block:
    """One layer's bipartite message graph (see the module docstring)."""

    edge_index: Tensor
    """``[2, e]`` int64: row 0 the source in ``[0, num_src)``, row 1 the destination in
    ``[0, num_dst)``; sorted by destination."""
    num_src: int
    """Input rows of the layer."""
    num_dst: int
    """Output rows of the layer (a prefix of the input rows)."""
    weight: Tensor
    """``[e]`` float64 aggregation weight of each edge."""

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


@dataclass
class MiniBatch:
    """One step's computation graph on one rank."""

    nodes: Tensor
    """``[blocks[0].num_src]`` int64 global ids of the input rows (whose features are read
    or fetched); ``nodes[:blocks[l].num_dst]`` are the output rows of layer l."""
    blocks: list[Block]
    """One per layer, input layer first."""
    target: Tensor
    """``[t]`` int64 positions among the last layer's output rows whose loss counts (the
    batch's training nodes owned by this rank)."""
    target_weight: Tensor | None = None
    """``[t]`` float64 loss weight of each target (GraphSAINT's ``1 / p_v``); None = 1."""

    @property
    def num_sampled_nodes(self) -> int:
        return int(self.nodes.numel())

    @property
    def num_sampled_edges(self) -> int:
        return sum(b.num_edges for b in self.blocks)

    @property
    def output_nodes(self) -> Tensor:
        """Global ids of the last layer's output rows."""
        return self.nodes[: self.blocks[-1].num_dst]


def empty_batch(num_layers: int) -> MiniBatch:
    """A batch with no nodes: a rank with nothing left this step still takes the step (and
    enters its collectives) with it."""
    e = torch.zeros(2, 0, dtype=torch.long)
    blocks = [Block(edge_index=e, num_src=0, num_dst=0, weight=torch.zeros(0, dtype=torch.float64))
              for _ in range(num_layers)]
    return MiniBatch(nodes=torch.zeros(0, dtype=torch.long), blocks=blocks,
                     target=torch.zeros(0, dtype=torch.long))


def split_evenly(units: Tensor, steps: int) -> list[Tensor]:
    """``units`` cut into exactly ``steps`` consecutive chunks whose sizes differ by at most
    one (the first ``len % steps`` chunks are one longer); chunks may be empty. This is how
    every sampler meets the rank-wide step count: no unit is dropped or repeated."""
    n = int(units.numel())
    base, extra = divmod(n, steps)
    sizes = [base + 1] * extra + [base] * (steps - extra)
    return list(torch.split(units, sizes))


@runtime_checkable
class Sampler(Protocol):
    """A mini-batch sampler over one rank's seeds."""

    num_layers: int

    def num_batches(self) -> int:
        """Batches this rank would take per epoch on its own (the trainer runs
        ``max`` over ranks of this, so that every rank takes the same number of steps)."""
        ...

    def epoch(self, steps: int, generator: torch.Generator) -> Iterator[MiniBatch]:
        """Exactly ``steps`` batches covering this epoch's seeds (see :func:`split_evenly`);
        the same ``generator`` state gives the same batches."""
        ...
