"""METIS k-way partitioning through pymetis.

METIS wants an undirected graph without self loops in CSR form (``xadj``/``adjncy``,
both directions of every edge stored once), so the edge list is symmetrised, stripped of
self loops and duplicates, and sorted by (row, column) first.

We always call the k-way routine (``METIS_PartGraphKway``): pymetis would otherwise pick
recursive bisection for up to 8 parts, which ignores ``objtype`` and so could not
minimise the communication volume. ``objtype`` is ``METIS_OBJTYPE_CUT`` for objective
``"cut"`` and ``METIS_OBJTYPE_VOL`` for ``"vol"``; ``seed`` makes the result repeatable
(METIS is single-threaded, so a given seed and graph give the same partition).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pymetis
import torch
from torch import Tensor

from commgnn.errors import PartitionError
from commgnn.partition.base import PARTITIONERS

if TYPE_CHECKING:
    from commgnn.partition.config import PartitionConfig

_OBJTYPE = {"cut": pymetis.ObjType.CUT, "vol": pymetis.ObjType.VOL}


def symmetric_csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``(xadj [N+1], adjncy [nnz])`` int64 of the symmetrised, self-loop-free, deduplicated graph."""
    src, dst = edge_index[0], edge_index[1]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # row * N + col orders by row then column; unique() sorts and removes duplicates in one pass.
    keys = torch.unique(torch.cat([src * num_nodes + dst, dst * num_nodes + src]))
    rows, cols = keys // num_nodes, keys % num_nodes
    xadj = torch.zeros(num_nodes + 1, dtype=torch.int64)
    xadj[1:] = torch.cumsum(torch.bincount(rows, minlength=num_nodes), 0)
    return xadj, cols


def metis_parts(xadj: Tensor, adjncy: Tensor, num_parts: int, seed: int, objective: str | None = None, *,
                task: str, too_large: str, failed: str = "") -> Tensor:
    """``[N]`` int64 part ids from METIS's k-way routine on the CSR graph ``(xadj, adjncy)`` of
    :func:`symmetric_csr`; ``objective`` "cut" or "vol" (None: METIS's default). Raises
    :class:`PartitionError` where the graph is too large for a 32-bit METIS (the message ends
    in the hint ``too_large``) or where METIS fails ("METIS failed to <task>: <why>", then
    ``failed`` as a hint when given)."""
    num_nodes = xadj.numel() - 1
    # Match METIS's idx_t width so pymetis passes the arrays without copying them.
    idx = pymetis.zero_copy_dtype()
    if idx == np.int32 and max(num_nodes, adjncy.numel()) >= 2**31:
        raise PartitionError(f"graph too large for this METIS build (32-bit ids, {adjncy.numel()} "
                             f"adjacency entries); {too_large}")
    adjacency = pymetis.CSRAdjacency(np.ascontiguousarray(xadj.numpy(), dtype=idx),
                                     np.ascontiguousarray(adjncy.numpy(), dtype=idx))
    options = (pymetis.Options(seed=int(seed)) if objective is None else
               pymetis.Options(seed=int(seed), objtype=int(_OBJTYPE[objective])))
    try:
        result = pymetis.part_graph(num_parts, adjacency, recursive=False, options=options)
    except (RuntimeError, MemoryError) as exc:
        raise PartitionError(f"METIS failed to {task}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             + (f"; {failed}" if failed else "")) from None
    return torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int64).copy())


@PARTITIONERS.register("metis")
def metis_partition(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
    """``[num_nodes]`` int64 METIS part ids; raises :class:`PartitionError` if a part comes back empty."""
    if num_parts == 1:
        return torch.zeros(num_nodes, dtype=torch.int64)
    xadj, adjncy = symmetric_csr(edge_index, num_nodes)
    parts = metis_parts(xadj, adjncy, num_parts, cfg.seed, cfg.objective,
                        task=f"split {num_nodes} nodes into {num_parts} parts",
                        too_large="use method='random' or a 64-bit METIS")
    sizes = torch.bincount(parts, minlength=num_parts)
    empty = (sizes == 0).nonzero().flatten()
    if empty.numel() > 0:
        raise PartitionError(
            f"METIS left {empty.numel()} of {num_parts} partitions empty (first: {int(empty[0])}) "
            f"for {num_nodes} nodes; use fewer parts, another seed or method='random'")
    return parts
