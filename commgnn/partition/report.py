"""Quality of a partition: cut, communication volume, per-rank halo traffic and balance.

Definitions (directed ``edge_index``, message flow source -> target):

* ``edge_cut``: unordered pairs {u, v} in different parts joined by an edge in either
  direction, each counted once (self loops never cross).
* ``cut_edges_directed``: ``edge_index`` columns whose endpoints lie in different parts
  (duplicates counted).
* ``H_i``: nodes outside part i with an edge into part i (the halo of rank i);
  ``comm_volume`` C = sum_i |H_i| (METIS's "total communication volume").
* ``halo_in[i]`` = |H_i| rows rank i receives per exchanged layer;
  ``halo_out[i]`` = sum_q |V_i ∩ H_q| rows it sends. Both sum to C; the busiest rank,
  ``max_rank_halo`` = max_i max(halo_in[i], halo_out[i]), sets the time floor.
* balance = max / mean over ranks of owned ``nodes``, ``edges`` (edges whose target is
  owned: the aggregation work) and ``train_nodes``; 1.0 is perfect.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from commgnn.partition.base import check_edge_index, check_parts


def _balance(counts: Tensor) -> float:
    mean = counts.double().mean().item()
    # All-zero counts (e.g. no training nodes at all) are trivially balanced.
    return float(counts.max().item() / mean) if mean > 0 else 1.0


@dataclass(frozen=True, kw_only=True)
class PartitionReport:
    """Partition quality numbers (see the module docstring for the definitions)."""

    num_parts: int
    """Number of parts P."""
    num_nodes: int
    """Nodes in the graph."""
    num_edges: int
    """Columns of ``edge_index``."""
    edge_cut: int
    """Undirected node pairs joined across parts, each counted once."""
    cut_edges_directed: int
    """``edge_index`` columns crossing parts."""
    comm_volume: int
    """C = sum of halo sizes: rows moved per exchanged feature column, all ranks together."""
    halo_in: tuple[int, ...]
    """``[P]`` halo rows each rank receives (|H_i|)."""
    halo_out: tuple[int, ...]
    """``[P]`` rows each rank sends to all its peers together."""
    max_halo_in: int
    """Largest ``halo_in``."""
    mean_halo_in: float
    """Mean ``halo_in`` (= C / P)."""
    max_halo_out: int
    """Largest ``halo_out``."""
    mean_halo_out: float
    """Mean ``halo_out`` (= C / P)."""
    max_rank_halo: int
    """Busiest rank's rows in or out, whichever is larger."""
    nodes: tuple[int, ...]
    """``[P]`` owned nodes per rank."""
    edges: tuple[int, ...]
    """``[P]`` edges whose target each rank owns."""
    train_nodes: tuple[int, ...] | None
    """``[P]`` owned training nodes per rank; ``None`` without a train mask."""
    node_balance: float
    """max / mean of ``nodes``."""
    edge_balance: float
    """max / mean of ``edges``."""
    train_balance: float | None
    """max / mean of ``train_nodes``; ``None`` without a train mask."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartitionReport:
        """Inverse of :meth:`to_dict` (e.g. for the report stored in a partition's meta.json)."""
        kw = {f.name: d[f.name] for f in fields(cls)}
        for k, v in kw.items():
            if isinstance(v, list):
                kw[k] = tuple(v)
        return cls(**kw)


def partition_report(edge_index: Tensor, parts: Tensor, num_parts: int,
                     train_mask: Tensor | None = None) -> PartitionReport:
    """Measure the partition ``parts`` (``[N]`` part ids) of the graph ``edge_index``."""
    n = int(parts.numel())
    P = num_parts
    parts = check_parts(parts, n, P, allow_empty=True)
    edge_index = check_edge_index(edge_index, n)
    src, dst = edge_index[0], edge_index[1]
    sp, tp = parts[src], parts[dst]
    cross = sp != tp
    c_src, c_dst, c_tp = src[cross], dst[cross], tp[cross]

    lo, hi = torch.minimum(c_src, c_dst), torch.maximum(c_src, c_dst)
    edge_cut = int(torch.unique(lo * n + hi).numel())
    # Unique (receiver part, source node) pairs = halo entries; the owner is parts[source].
    halo = torch.unique(c_tp * n + c_src)
    h_recv, h_owner = halo // n, parts[halo % n]
    halo_in = torch.bincount(h_recv, minlength=P)
    halo_out = torch.bincount(h_owner, minlength=P)

    nodes = torch.bincount(parts, minlength=P)
    edges = torch.bincount(tp, minlength=P)
    train: Tensor | None = None
    if train_mask is not None:
        train = torch.bincount(parts[train_mask.to("cpu", torch.bool)], minlength=P)

    return PartitionReport(
        num_parts=P, num_nodes=n, num_edges=int(src.numel()),
        edge_cut=edge_cut,
        cut_edges_directed=int(cross.sum()),
        comm_volume=int(halo.numel()),
        halo_in=tuple(halo_in.tolist()),
        halo_out=tuple(halo_out.tolist()),
        max_halo_in=int(halo_in.max()),
        mean_halo_in=float(halo_in.double().mean()),
        max_halo_out=int(halo_out.max()),
        mean_halo_out=float(halo_out.double().mean()),
        max_rank_halo=int(torch.maximum(halo_in, halo_out).max()),
        nodes=tuple(nodes.tolist()),
        edges=tuple(edges.tolist()),
        train_nodes=None if train is None else tuple(train.tolist()),
        node_balance=_balance(nodes),
        edge_balance=_balance(edges),
        train_balance=None if train is None else _balance(train),
    )


def format_report(report: PartitionReport, *, max_rows: int = 32) -> str:
    """A small plain-text table: totals, then one row per rank (elided past ``max_rows``)."""
    r = report
    pct = 100.0 * r.cut_edges_directed / r.num_edges if r.num_edges else 0.0
    lines = [
        f"{r.num_parts} parts of {r.num_nodes:,} nodes / {r.num_edges:,} edges",
        f"edge cut      {r.edge_cut:,} node pairs ({r.cut_edges_directed:,} directed edges, {pct:.1f}%)",
        f"comm volume   C = {r.comm_volume:,} halo rows "
        f"(per rank in: max {r.max_halo_in:,} mean {r.mean_halo_in:,.1f}; "
        f"out: max {r.max_halo_out:,} mean {r.mean_halo_out:,.1f})",
        "balance       nodes {:.3f}  edges {:.3f}{}  (max/mean)".format(
            r.node_balance, r.edge_balance,
            "" if r.train_balance is None else f"  train {r.train_balance:.3f}"),
        "",
    ]
    cols = ["rank", "nodes", "edges"] + (["train"] if r.train_nodes is not None else []) + ["halo_in", "halo_out"]
    rows = []
    for i in range(r.num_parts):
        row = [str(i), f"{r.nodes[i]:,}", f"{r.edges[i]:,}"]
        if r.train_nodes is not None:
            row.append(f"{r.train_nodes[i]:,}")
        rows.append(row + [f"{r.halo_in[i]:,}", f"{r.halo_out[i]:,}"])
    widths = [max(len(c), *(len(row[j]) for row in rows)) for j, c in enumerate(cols)]
    lines.append("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    shown = rows if len(rows) <= max_rows else rows[: max_rows // 2] + [None] + rows[-(max_rows // 2):]
    for row in shown:
        if row is None:
            lines.append(f"  ... {len(rows) - 2 * (max_rows // 2)} more ranks ...")
        else:
            lines.append("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    return "\n".join(lines)
