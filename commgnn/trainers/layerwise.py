"""Exact inference layer by layer, in chunks of owned rows: full neighbourhoods, bounded memory.

The full-graph forward holds, per layer, every owned row, every halo row and their
concatenation ``[n_own + n_halo, d]`` at once, plus the CSR operator over all local edges.
On a graph whose halo is as large as its owned rows (a 10M-node graph on 4 ranks: 2.5M
owned and 3.3M halo rows a rank), that is what stops evaluation from fitting. Layer-wise
inference (as DGL's and PyG's "layer-wise full-neighbourhood" inference, here across
ranks) computes layer ``l + 1`` for all owned rows before layer ``l + 2``, one chunk of
``c`` destination rows at a time::

    for l in layers:                                   H_0 = x (owned rows)
        for chunk [a, b) of owned rows:                (the same number of rounds on every rank)
            S   = sources of the chunk's in-edges      (local ids: owned, then halo)
            R   = H_l[S owned] ++ fetch(H_l, S halo)   one request-reply round, rows from their owners
            H_{l+1}[a:b] = act(conv_l(R -> [a, b)))    the mean over full in-neighbourhoods

so a rank holds ``H_l`` and ``H_{l+1}`` (owned rows only), one chunk's edges and source
rows, and its local edges as the partition stores them (sorted by target). Every value is the full-graph forward's
(the same edges, the same mean weights ``1 / in-degree``, eval mode): a parity test holds
it to :meth:`FullGraphTrainer.predict`. Halo rows are fetched per chunk, so a row that
several chunks need travels several times: the bytes (``halo_eval``) exceed one exact
exchange by that factor, which ``chunk_rows`` trades against memory.

GraphSAGE only (the sampled model, :data:`~commgnn.models.blocks.SAMPLED_MODELS`): its
mean needs nothing beyond the destination's own in-edges. Written here rather than taken
from PyG: PyG's layer-wise inference runs one process over a whole graph in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.distributed.request import request_reply
from commgnn.models.blocks import BlockGraph
from commgnn.models.net import PartitionGNN, activation
from commgnn.partition.local import LocalPartition
from commgnn.sampling.base import Block
from commgnn.sampling.config import SamplerConfig

DEFAULT_CHUNK_ROWS = SamplerConfig().inference_chunk
"""Destination rows per chunk when the caller names none (``minibatch.inference_chunk``)."""


def layerwise_bytes(*, own: int, chunk_rows: int, edges: int, num_nodes: int, dims: Sequence[int],
                    avg_degree: float, dtype_bytes: int = 4, feature_bytes: int | None = None) -> float:
    """Peak bytes of :func:`layerwise_forward` on one rank beyond its partition, for layer
    widths ``dims = [F, d_1, ..., C]``: the largest input plus output of a layer on the owned
    rows (layer 0's input the features at ``feature_bytes`` a value, as stored), and one
    chunk: its edges (``c * avg_degree``, 40 bytes each with the block's weights and its
    CSR) and source rows (``c (1 + avg_degree)``, at most ``N``) at the widest input, three
    copies (gathered, fetched, concatenated)."""
    b = dtype_bytes
    fb = b if feature_bytes is None else feature_bytes
    layer = max((dims[i] * (fb if i == 0 else b) + dims[i + 1] * b) for i in range(len(dims) - 1))
    wide = max(dims[:-1])
    chunk_edges = min(chunk_rows * avg_degree, float(edges))
    chunk_src = min(chunk_rows * (1 + avg_degree), float(num_nodes))
    return own * layer + 40 * chunk_edges + 3 * chunk_src * wide * b


class _InCSR:
    """This rank's local edges sorted by destination (as a partition stores them; sorted here
    otherwise): chunk ``[a, b)``'s in-edges are the slice ``src[ptr[a]:ptr[b]]``."""

    def __init__(self, part: LocalPartition) -> None:
        # a rank folder's own arrays (its edges are never expanded), else a view of the
        # partition's sources (sorted by target as built; sorted here otherwise)
        self.ptr, self.src = part.in_csr()

    def chunk(self, a: int, b: int) -> tuple[Tensor, Tensor]:
        """``(src [e] int64 local ids, pos [e] int64 in [0, b - a))`` of chunk ``[a, b)``'s
        in-edges, grouped by destination."""
        lo, hi = int(self.ptr[a]), int(self.ptr[b])
        deg = self.ptr[a + 1:b + 1] - self.ptr[a:b]
        return self.src[lo:hi].to(torch.int64), torch.repeat_interleave(torch.arange(b - a), deg)


@torch.no_grad()
def layerwise_forward(ctx: DistContext, hooks: Hooks, model: PartitionGNN, part: LocalPartition, x: Tensor,
                      owner: Tensor, row: Tensor, *, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                      upto: int | None = None) -> Tensor:
    """``[n_own, C]`` logits of this rank's nodes (``upto = k``: layer k's output), equal to
    the full-graph eval-mode forward (module docstring). ``x [n_own, F]``: the owned rows
    (any floating dtype: half-precision rows travel as stored and are converted per chunk);
    ``owner [N]`` / ``row [N]``: every node's owner rank and its row there. All ranks call it
    together (one request-reply round per chunk and layer, the same count everywhere)."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    model.eval()
    n_own = part.num_owned
    csr = _InCSR(part)
    halo_ids = part.halo_global_ids.cpu()
    halo_owner, halo_row = owner[halo_ids], row[halo_ids].to(torch.int64)
    chunks = math.ceil(n_own / chunk_rows)
    if ctx.is_distributed:  # every rank runs the same number of rounds
        chunks = int(ctx.all_reduce(torch.tensor([float(chunks)], dtype=torch.float64), "max")[0])
    last = len(model.convs) - 1
    wdtype = next(model.parameters()).dtype
    h = x
    for i, conv in enumerate(model.convs):
        out: Tensor | None = None
        for c in range(chunks):
            a, b = min(c * chunk_rows, n_own), min((c + 1) * chunk_rows, n_own)
            src, pos = csr.chunk(a, b)
            needed, local = torch.unique(src, return_inverse=True)  # sorted: owned ids first, then halo
            n_in = int(torch.searchsorted(needed, n_own))
            halo = needed[n_in:] - n_own

            def serve(rows: Tensor, table: Tensor = h) -> Tensor:
                return table[rows]

            fetched = request_reply(ctx, hooks, halo_owner[halo], halo_row[halo], serve,
                                    req_kind="halo_eval", rep_kind="halo_eval")
            rows = torch.cat([h[a:b], h[needed[:n_in]], fetched]).to(wdtype)  # stored features may be float16
            del fetched
            deg = torch.bincount(pos, minlength=b - a).clamp(min=1).to(torch.float64)
            block = Block(edge_index=torch.stack([local + (b - a), pos]), num_src=int(rows.shape[0]),
                          num_dst=b - a, weight=1.0 / deg[pos])
            y = conv.combine(conv.message(rows), rows[: b - a], BlockGraph(block))
            if i < last:
                y = activation(model.cfg, y)
            if out is None:
                out = torch.empty((n_own, y.shape[1]), dtype=y.dtype)
            out[a:b] = y
        assert out is not None
        h = out
        if i == upto:
            break
    return h


@dataclass
class LayerwiseInference:
    """:func:`layerwise_forward` bound to one rank's trainer state: called as
    ``inference(upto)``, it replaces the trainer's full-graph eval forward
    (:attr:`commgnn.trainers.fullgraph.FullGraphTrainer.layerwise`)."""

    ctx: DistContext
    hooks: Hooks
    """Where the fetched rows' bytes are counted (``halo_eval``)."""
    model: PartitionGNN
    part: LocalPartition
    x: Tensor
    """``[n_own, F]`` the owned rows."""
    owner: Tensor
    """``[N]`` every node's owner rank."""
    row: Tensor
    """``[N]`` every node's row on its owner."""
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    """Destination rows per chunk."""

    def __call__(self, upto: int | None = None) -> Tensor:
        return layerwise_forward(self.ctx, self.hooks, self.model, self.part, self.x, self.owner, self.row,
                                 chunk_rows=self.chunk_rows, upto=upto)
