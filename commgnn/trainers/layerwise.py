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

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.distributed.request import request_reply
from commgnn.models.blocks import BlockGraph
from commgnn.models.net import PartitionGNN
from commgnn.partition.local import LocalPartition
from commgnn.sampling.base import Block
from commgnn.trainers.pushed_mean import pushed_mean
from commgnn.sampling.config import SamplerConfig

DEFAULT_CHUNK_ROWS = SamplerConfig().inference_chunk
"""Destination rows per chunk when the caller names none (``minibatch.inference_chunk``)."""


def layerwise_bytes(*, own: int, chunk_rows: int, edges: int, num_nodes: int, dims: Sequence[int],
                    avg_degree: float, dtype_bytes: int = 4, feature_bytes: int | None = None) -> float:
    """Peak bytes of :func:`layerwise_forward` on one rank beyond its partition, for layer
    widths ``dims = [F, d_1, ..., C]``: the largest input plus output of a layer on the owned
    rows (layer 0's input the features at ``feature_bytes`` a value, as stored), and one
    chunk: its edges (``c * avg_degree``, at most :data:`CHUNK_EDGES`; 40 bytes each with
    the block's weights and its CSR) and source rows (its rows and edges, at most ``N``)
    at the widest input, three copies (gathered, fetched, concatenated)."""
    b = dtype_bytes
    fb = b if feature_bytes is None else feature_bytes
    layer = max((dims[i] * (fb if i == 0 else b) + dims[i + 1] * b) for i in range(len(dims) - 1))
    wide = max(dims[:-1])
    chunk_edges = min(chunk_rows * avg_degree, float(CHUNK_EDGES), float(edges))
    chunk_src = min(chunk_rows + chunk_edges, float(num_nodes))
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

    def rows(self, dst: Tensor) -> tuple[Tensor, Tensor]:
        """``(src [e] int64 local ids, pos [e] int64 in [0, m))`` of the in-edges of the owned
        rows ``dst [m]`` (any order), grouped by destination: :meth:`chunk` for rows that
        are not one slice."""
        start, deg = self.ptr[dst].to(torch.int64), (self.ptr[dst + 1] - self.ptr[dst]).to(torch.int64)
        pos = torch.repeat_interleave(torch.arange(dst.numel()), deg)
        first = torch.cumsum(deg, 0) - deg  # where each destination's edges start in the output
        return self.src[start[pos] + torch.arange(pos.numel()) - first[pos]].to(torch.int64), pos


def _at(rows: Tensor, held: Tensor | None) -> Tensor:
    """Positions of the owned ``rows`` in a table held at the sorted rows ``held`` (None:
    the table holds every owned row, position = row)."""
    if held is None:
        return rows
    at = torch.searchsorted(held, rows)
    if rows.numel() and not bool((held[at.clamp(max=held.numel() - 1)] == rows).all()):
        raise RuntimeError("layer-wise inference asked for a row outside the receptive field it computed")
    return at


CHUNK_EDGES = 1 << 20
"""In-edges per chunk at most (beyond one row's own): a chunk of ``chunk_rows`` rows with
hubs among them gathers one source row per edge, so chunks end at this many edges too."""


def chunk_bounds(ptr: Tensor, dst: Tensor | None, n: int, chunk_rows: int,
                 chunk_edges: int = CHUNK_EDGES) -> list[tuple[int, int]]:
    """``[a, b)`` ranges of the ``n`` destination rows (``dst``, or rows ``0 .. n`` when
    None), each at most ``chunk_rows`` rows and ``chunk_edges`` in-edges (a row with more
    has a chunk of its own): a chunk starts where ``floor(i / c) + floor(E_i / e)``
    changes, ``E_i`` the in-edges before row ``i``."""
    if n == 0:
        return []
    deg = (ptr[1:n + 1] - ptr[:n]) if dst is None else (ptr[dst + 1] - ptr[dst])
    before = torch.cumsum(deg.to(torch.int64), 0) - deg
    key = torch.arange(n) // chunk_rows + before // chunk_edges
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(key[1:] != key[:-1]).flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([n])])
    return list(zip(starts.tolist(), ends.tolist()))


def receptive_rows(ctx: DistContext, hooks: Hooks, part: LocalPartition, owner: Tensor, row: Tensor,
                   targets: Tensor, layers: int, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> list[Tensor]:
    """``need[l]``, for ``l = 0 .. layers``: the sorted owned rows at which layer ``l``'s
    output (``l = 0``: the input features) is needed for the outputs at ``targets`` (sorted
    owned rows) after ``layers`` layers::

        need[L]   = targets
        need[l]   = need[l+1]  U  owned sources of need[l+1]'s in-edges
                               U  rows the other ranks' need[l+1] reaches over their halo

    marked in a bool mask over the owned and one over the halo rows, a chunk of in-edges at
    a time (:func:`chunk_bounds`), then one notification round (ids out, a byte back) per
    layer, on every rank together."""
    n_own, csr = part.num_owned, _InCSR(part)
    halo_ids = part.halo_global_ids.cpu()
    need: list[Tensor] = [targets] * (layers + 1)
    for l in range(layers - 1, -1, -1):
        dst = need[l + 1]
        mine = torch.zeros(n_own, dtype=torch.bool)
        theirs = torch.zeros(part.num_halo, dtype=torch.bool)
        mine[dst] = True
        for a, b in chunk_bounds(csr.ptr, dst, int(dst.numel()), chunk_rows):
            src, _ = csr.rows(dst[a:b])
            local = src < n_own
            mine[src[local]] = True
            theirs[src[~local] - n_own] = True
            del src, local

        def note(rows: Tensor) -> Tensor:
            mine[rows.to(torch.int64)] = True
            return torch.ones((rows.shape[0], 1), dtype=torch.uint8)

        ids = halo_ids[theirs.nonzero().flatten()]
        del theirs
        request_reply(ctx, hooks, owner[ids], row[ids].to(torch.int64), note, req_kind="halo_eval",
                      rep_kind="halo_eval")
        need[l] = mine.nonzero().flatten()
    return need


COMPACT_SHARE = 0.25
"""Targets' layer-wise pass: the receptive field's feature rows are read once into memory
when they are at most this share of the owned rows; for a wider field (a copy of most of
them would not fit beside the memory map) their owners sum them where they lie
(:func:`~commgnn.trainers.pushed_mean.pushed_mean`)."""


@torch.no_grad()
def layerwise_forward(ctx: DistContext, hooks: Hooks, model: PartitionGNN, part: LocalPartition, x: Tensor,
                      owner: Tensor, row: Tensor, *, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                      upto: int | None = None, targets: Tensor | None = None,
                      stats: dict[str, Any] | None = None) -> Tensor:
    """``[n_own, C]`` logits of this rank's nodes (``upto = k``: layer k's output), equal to
    the full-graph eval-mode forward (module docstring). ``x [n_own, F]``: the owned rows
    (any floating dtype: half-precision rows travel as stored and are converted per chunk);
    ``owner [N]`` / ``row [N]``: every node's owner rank and its row there. All ranks call it
    together (one request-reply round per chunk and layer, the same count everywhere).

    ``targets [m]`` (sorted owned rows): ``[m, C]``, the outputs at those rows alone, each
    layer computed only where the next needs it (:func:`receptive_rows`), the feature rows
    of the receptive field read once, in file order, before the first layer: predicting a
    split of a graph whose every row's scores would not fit, without a random read per
    chunk and row. ``stats``, if given, receives ``receptive_rows``: ``|need[l]|`` per layer.

    Chunks end at ``chunk_rows`` destination rows or :data:`CHUNK_EDGES` in-edges
    (:func:`chunk_bounds`), whichever comes first."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    model.eval()
    n_own = part.num_owned
    csr = _InCSR(part)
    halo_ids = part.halo_global_ids.cpu()
    halo_owner, halo_row = owner[halo_ids], row[halo_ids].to(torch.int64)
    last = len(model.convs) - 1
    depth = last + 1 if upto is None else min(upto, last) + 1
    need: list[Tensor | None] = [None] * (depth + 1)
    if targets is not None:
        need = list(receptive_rows(ctx, hooks, part, owner, row, targets.to(torch.int64), depth, chunk_rows))
        if stats is not None:
            stats["receptive_rows"] = [int(t.numel()) for t in need]
    pushed = targets is not None and need[0] is not None and need[0].numel() > COMPACT_SHARE * n_own
    wdtype = next(model.parameters()).dtype
    h = x
    if need[0] is not None and not pushed:  # the receptive field's feature rows, read once in file order
        h = x[need[0]]
    for i, conv in enumerate(model.convs[:depth]):
        if i == 0 and pushed:  # a wide field: its owners sum the rows where they lie, each read once
            dst = need[1]
            assert dst is not None
            mean = pushed_mean(ctx, hooks, csr.ptr, csr.rows, x, dst, halo_owner, halo_row, n_own, wdtype)
            y = conv.from_precomputed(mean, x[dst].to(wdtype), None)
            del mean
            h = model.post(0, y) if i < last else y
            continue
        dst_rows, held = need[i + 1], need[i]  # where this layer's output is needed; where h is held
        n_dst = n_own if dst_rows is None else int(dst_rows.numel())
        bounds = chunk_bounds(csr.ptr, dst_rows, n_dst, chunk_rows)
        chunks = len(bounds)
        if ctx.is_distributed:  # every rank runs the same number of rounds
            chunks = int(ctx.all_reduce(torch.tensor([float(chunks)], dtype=torch.float64), "max")[0])
        bounds += [(n_dst, n_dst)] * (chunks - len(bounds))
        out: Tensor | None = None
        for a, b in bounds:
            if dst_rows is None:
                src, pos = csr.chunk(a, b)
                own_dst = h[a:b]
            else:
                src, pos = csr.rows(dst_rows[a:b])
                own_dst = h[_at(dst_rows[a:b], held)]
            needed, local = torch.unique(src, return_inverse=True)  # sorted: owned ids first, then halo
            n_in = int(torch.searchsorted(needed, n_own))
            halo = needed[n_in:] - n_own

            def serve(rows: Tensor, table: Tensor = h, held: Tensor | None = held) -> Tensor:
                return table[_at(rows, held)]

            fetched = request_reply(ctx, hooks, halo_owner[halo], halo_row[halo], serve,
                                    req_kind="halo_eval", rep_kind="halo_eval")
            rows = torch.cat([own_dst, h[_at(needed[:n_in], held)], fetched]).to(wdtype)  # float16 as stored
            del fetched
            deg = torch.bincount(pos, minlength=b - a).clamp(min=1).to(torch.float64)
            block = Block(edge_index=torch.stack([local + (b - a), pos]), num_src=int(rows.shape[0]),
                          num_dst=b - a, weight=1.0 / deg[pos])
            y = conv.combine(conv.message(rows), rows[: b - a], BlockGraph(block))
            if i < last:
                y = model.post(i, y)
            if out is None:
                out = torch.empty((n_dst, y.shape[1]), dtype=y.dtype)
            out[a:b] = y
        assert out is not None
        h = out
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
    stats: dict[str, Any] = field(default_factory=dict)
    """The last targeted pass's ``receptive_rows`` (:func:`layerwise_forward`)."""

    def __call__(self, upto: int | None = None, targets: Tensor | None = None) -> Tensor:
        return layerwise_forward(self.ctx, self.hooks, self.model, self.part, self.x, self.owner, self.row,
                                 chunk_rows=self.chunk_rows, upto=upto, targets=targets, stats=self.stats)
