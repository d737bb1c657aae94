"""Evaluation by neighbour sampling (``minibatch.inference = "sampled"``).

Exact inference runs the model over every node, layer by layer
(:mod:`commgnn.trainers.layerwise`): each layer reads every edge, and every halo row
travels once per chunk that needs it. On a graph of 100M nodes of which 0.3% are scored
(papers100M's validation and test splits), that pass costs more than the epoch it checks.
Sampled evaluation scores only the split's nodes, as their training batches do: each
split's owned nodes are cut into batches of ``minibatch.batch_size``, their neighbours
drawn with ``minibatch.fanout`` (the owners draw them over a partitioned topology), their
feature rows fetched, and the model run in eval mode (no dropout)::

    for split s in (train, val, test):  rows_s = owned nodes of s         [m_s]
        for each batch B of rows_s:     blocks = sample(B, fanout)
                                        pred_B = argmax model(x[nodes(blocks)], blocks)
        correct_s = sum(pred == y)

The scores are estimates (a sampled neighbourhood, not the full one): this is how the
peers evaluate at that scale (DGL's and PyG's papers100M examples). Every evaluation
draws from the same fixed stream (``seed``), so two evaluations of the same weights agree,
and it puts back the training streams it shares (the owners' stream that answers peers'
neighbour requests), so that training samples exactly what it would without evaluation.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from commgnn.distributed import DistContext
from commgnn.sampling.base import MiniBatch
from commgnn.sampling.neighbor import NeighborSampler, NeighborSource


class SampledInference:
    """Class scores of chosen owned rows by neighbour sampling (module docstring)."""

    def __init__(self, ctx: DistContext, *, source: NeighborSource, fanout: tuple[int, ...], batch_size: int,
                 global_ids: Tensor, row: Tensor, seed: int, streams: list[torch.Generator],
                 fetch: Callable[[Tensor], Tensor], forward: Callable[[Tensor, MiniBatch], Tensor]) -> None:
        """``source``: the training sampler's neighbour source; ``global_ids [n_own]``: the
        owned rows' ids; ``row [N]``: every node's row on its owner; ``streams``: generators
        the sampling also draws from, restored afterwards; ``fetch(ids) -> rows``: the
        training feature fetch; ``forward(rows, batch) -> logits`` (eval mode, no grad)."""
        self.ctx, self.source, self.fanout, self.batch_size = ctx, source, tuple(fanout), batch_size
        self.global_ids, self.row, self.seed, self.streams = global_ids, row, seed, streams
        self.fetch, self.forward = fetch, forward

    @torch.no_grad()
    def scores(self, rows: Tensor) -> Tensor:
        """``[m, C]`` logits of the owned rows ``rows [m]`` (in that order). All ranks call it
        together: every rank runs as many batches as the rank with the most rows."""
        sampler = NeighborSampler(self.source, self.global_ids[rows], self.fanout, self.batch_size)
        steps = int(self.ctx.all_reduce(torch.tensor([float(sampler.num_batches())], dtype=torch.float64),
                                        "max")[0]) if self.ctx.is_distributed else sampler.num_batches()
        saved = [g.get_state() for g in self.streams]
        out: Tensor | None = None
        pos = torch.full((self.global_ids.numel(),), -1, dtype=torch.int64)  # owned row -> place in `rows`
        pos[rows] = torch.arange(rows.numel())
        try:
            gen = torch.Generator().manual_seed(self.seed)
            for batch in sampler.epoch(steps, gen):
                logits = self.forward(self.fetch(batch.nodes), batch)
                tgt = batch.target
                if out is None:
                    out = logits.new_zeros((rows.numel(), logits.shape[1]))
                # the batch's seeds (distinct owned nodes) at their places in `rows`
                out[pos[self.row[batch.output_nodes[tgt]].to(torch.int64)]] = logits[tgt].to(out.dtype)
        finally:
            for g, state in zip(self.streams, saved):
                g.set_state(state)
        return out if out is not None else torch.zeros((rows.numel(), 0))
