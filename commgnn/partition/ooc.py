"""Partition a graph folder out of core: choose the parts, write one folder per rank.

:func:`partition_graph_folder` is the whole step for a
:class:`~commgnn.data.ondisk.GraphFolder`:

* ``lp-metis`` (the default for folders): the symmetric CSR is built on disk
  (:mod:`commgnn.partition.disk_csr`) and clustered, coarsened and partitioned with
  bounded memory (:mod:`commgnn.partition.lp_metis`);
* ``random`` and ``contiguous``: no edges are read for the assignment;
* any other registered method (``metis``, ``ldg``): only where it fits, as for an
  in-memory graph: the edge list is loaded and the method's memory estimate is checked
  against ``partition.memory_limit_gb`` first (a one-line :class:`PartitionError` naming
  a leaner method otherwise).

The folders are then written by :func:`commgnn.partition.folders.write_partition_folders`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commgnn.config import one_line_errors
from commgnn.errors import PartitionError
from commgnn.partition.api import assign_parts, check_partition_memory
from commgnn.partition.base import PARTITIONERS, check_parts
from commgnn.partition.config import PartitionConfig
from commgnn.partition.disk_csr import EDGE_CHUNK, build_symmetric_csr, folder_edge_chunks
from commgnn.partition.folders import folder_fingerprint, write_partition_folders
from commgnn.partition.lp_metis import lp_metis_csr

FOLDER_METHOD = "lp-metis"
"""The method :func:`partition_graph_folder` uses when no config is given."""
_NO_EDGES = ("random", "contiguous")


def folder_parts(folder: Any, num_parts: int, cfg: PartitionConfig, *, workdir: str | Path | None = None,
                 chunk: int = EDGE_CHUNK) -> np.ndarray:
    """``[N]`` int64 part ids of the graph folder by ``cfg.method`` (module docstring);
    ``workdir`` holds the on-disk CSR of ``lp-metis`` while it runs (default: the system's
    temporary directory)."""
    N = folder.num_nodes
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or not 0 < num_parts <= N:
        raise PartitionError(f"cannot split {N} nodes into {num_parts!r} partitions")
    if cfg.method == "lp-metis":
        if workdir is not None:
            Path(workdir).mkdir(parents=True, exist_ok=True)
        with build_symmetric_csr(folder_edge_chunks(folder, chunk), N,
                                 workdir=workdir if workdir is not None else tempfile.gettempdir()) as csr:
            parts = lp_metis_csr(csr, num_parts, seed=cfg.seed, objective=cfg.objective)
        return check_parts(torch.from_numpy(parts), N, num_parts).numpy()
    if cfg.method in _NO_EDGES:
        empty = torch.zeros((2, 0), dtype=torch.int64)
        parts_t = PARTITIONERS.get(cfg.method)(empty, N, num_parts, cfg)
        return check_parts(parts_t, N, num_parts).numpy()
    # In-memory methods: refuse, before loading the edges, what would not fit.
    check_partition_memory(cfg, N, folder.num_edges)
    edge_index = torch.from_numpy(np.asarray(folder.edge_index, dtype=np.int64))
    return assign_parts(edge_index, N, num_parts, cfg).numpy()


@one_line_errors
def partition_graph_folder(folder: Any, num_parts: int, cfg: PartitionConfig | None, out: str | Path, *,
                           meta: dict[str, Any] | None = None, workdir: str | Path | None = None,
                           copy_features: bool = True, chunk: int = EDGE_CHUNK) -> dict[str, Any]:
    """Partition the graph folder ``folder`` into ``num_parts`` parts with ``cfg`` (None:
    ``lp-metis`` with seed 0) and write the version-2 partition directory ``out``; return
    its report (:meth:`PartitionReport.to_dict`).

    ``meta`` (any JSON keys) goes into ``out/meta.json`` with ``method``, ``objective`` and
    ``seed`` filled in; without a ``graph_fingerprint`` it gets
    :func:`~commgnn.partition.folders.folder_fingerprint` (one streamed pass over the
    folder). ``workdir`` holds the scratch files (CSR, edge buckets), removed at the end."""
    cfg = cfg if cfg is not None else PartitionConfig(method=FOLDER_METHOD)
    meta = dict(meta or {})
    meta.setdefault("method", cfg.method)
    meta.setdefault("objective", cfg.objective)
    meta.setdefault("seed", cfg.seed)
    if "graph_fingerprint" not in meta:
        meta["graph_fingerprint"] = folder_fingerprint(folder)
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".partition-", dir=workdir)) if workdir is not None else None
    try:
        parts = folder_parts(folder, num_parts, cfg, workdir=scratch, chunk=chunk)
        path = write_partition_folders(folder, parts, num_parts, out, meta=meta, copy_features=copy_features,
                                       chunk=chunk, workdir=scratch)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    from commgnn.partition.store import load_meta
    return load_meta(path)["report"]
