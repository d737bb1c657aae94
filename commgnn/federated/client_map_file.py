"""Reading a client map file: which client owns each node (the ``file`` split method of
:func:`commgnn.federated.client_split.split_clients`).

Formats: ``.npy`` / ``.pt`` holding ``[N]`` integer client ids, or ``.csv`` with one
``node,client`` row per node (a header row is allowed). Client ids must be ``0..K-1``
without gaps. A ``.pt`` file is read with ``torch.load(..., weights_only=True)`` (tensors only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from commgnn.config import one_line_errors
from commgnn.errors import ConfigError, DataError
from commgnn.federated.config import FILE_SUFFIXES


@one_line_errors
def load_client_map(path: str | Path, num_nodes: int, n_clients: int) -> Tensor:
    """``[num_nodes]`` int64 client ids read from a ``.npy`` / ``.pt`` / ``.csv`` file.

    Raises:
        DataError: missing or unreadable file, wrong length, a node mapped to no client
            (missing from a CSV, or a negative / NaN id), non-integer ids, ids with gaps.
        ConfigError: unknown extension, or the file names another number of clients.
    """
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(f"client map {file} must end in .npy, .pt or .csv")
    if not file.is_file():
        raise DataError(f"client map file not found: {file}")
    where = f"client map {file}"
    try:
        if suffix == ".npy":
            values = torch.from_numpy(np.array(np.load(file, allow_pickle=False)))
        elif suffix == ".pt":
            values = torch.load(file, map_location="cpu", weights_only=True)
        else:
            values = _read_csv(file, num_nodes, where)
    except DataError:
        raise
    except Exception as exc:  # corrupt file, foreign pickle, bad CSV cell: one line
        text = " ".join(str(exc).split())[:200]
        raise DataError(f"cannot read {where}: {type(exc).__name__}: {text}") from exc
    if not isinstance(values, Tensor):
        raise DataError(f"{where} must hold a tensor of client ids, got {type(values).__name__}")
    return _check_owner(values, num_nodes, n_clients, where)


def _read_csv(file: Path, num_nodes: int, where: str) -> Tensor:
    """``node,client`` rows (optional header) -> ``[num_nodes]`` ids, ``-1`` for missing nodes."""
    with file.open("r", encoding="utf-8") as f:
        first = f.readline()
    header = int(bool(first.strip()) and not first.split(",")[0].strip().lstrip("-").isdigit())
    # numpy's C parser: no per-row Python loop even for millions of rows.
    try:
        rows = np.loadtxt(file, delimiter=",", dtype=np.float64, skiprows=header, ndmin=2)
    except ValueError:
        # An empty or non-numeric cell: the slower parser reads it as NaN, so the checks
        # below can name the node (or row) instead of quoting numpy's parse error.
        rows = np.atleast_2d(np.genfromtxt(file, delimiter=",", dtype=np.float64,
                                           skip_header=header))
    if rows.shape[0] == 0:
        raise DataError(f"{where} has no node,client rows")
    if rows.shape[1] != 2:
        raise DataError(f"{where} must have 2 columns (node,client), got {rows.shape[1]}")
    nodes = rows[:, 0]
    if not np.all(np.isfinite(nodes) & (nodes == np.round(nodes))):
        bad = int(np.flatnonzero(~(np.isfinite(nodes) & (nodes == np.round(nodes))))[0])
        raise DataError(f"{where}: row {bad + 1 + header} has node id {nodes[bad]!r}, not an integer")
    nodes = nodes.astype(np.int64)
    out = (nodes < 0) | (nodes >= num_nodes)
    if out.any():
        bad = int(np.flatnonzero(out)[0])
        raise DataError(f"{where}: row {bad + 1 + header} names node {nodes[bad]}, outside "
                        f"0..{num_nodes - 1} for a graph of {num_nodes} nodes")
    counts = np.bincount(nodes, minlength=num_nodes)
    if (counts > 1).any():
        dup = int(np.flatnonzero(counts > 1)[0])
        raise DataError(f"{where}: node {dup} appears in {counts[dup]} rows; give one client per node")
    values = torch.full((num_nodes,), float("nan"), dtype=torch.float64)
    values[torch.from_numpy(nodes)] = torch.from_numpy(rows[:, 1].copy())
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise DataError(f"{where}: node {int(missing[0])} is mapped to no client (no row for it; "
                        f"{missing.size} nodes missing); list every node 0..{num_nodes - 1}")
    return values


def _check_owner(values: Tensor, n: int, k: int, where: str) -> Tensor:
    if values.dim() != 1:
        raise DataError(f"{where} must be 1-D (one client id per node), got shape {list(values.shape)}")
    if values.numel() != n:
        raise DataError(f"{where} maps {values.numel()} nodes but the graph has {n}")
    if values.dtype == torch.bool or values.is_complex():
        raise DataError(f"{where} must hold integer client ids, got dtype {values.dtype}")
    if values.dtype.is_floating_point:
        nan = torch.isnan(values)
        if nan.any():
            node = int(nan.nonzero()[0])
            raise DataError(f"{where}: node {node} is mapped to no client (empty, NaN or "
                            f"non-numeric id); every node needs a client id in 0..{k - 1}")
        frac = values != torch.round(values)
        if frac.any():
            node = int(frac.nonzero()[0])
            raise DataError(f"{where}: node {node} has client id {float(values[node])}, "
                            f"not an integer")
    owner = values.to(torch.int64)
    negative = owner < 0
    if negative.any():
        node = int(negative.nonzero()[0])
        raise DataError(f"{where}: node {node} is mapped to no client (id {int(owner[node])}); "
                        f"every node needs a client id in 0..{k - 1}")
    ids = torch.unique(owner)
    m = int(ids[-1]) + 1
    if ids.numel() != m:
        gap = int((torch.isin(torch.arange(m), ids, invert=True)).nonzero()[0])
        raise DataError(f"{where}: client ids must run 0..{m - 1} without gaps, but no node "
                        f"has client {gap}")
    if m != k:
        raise ConfigError(f"{where} names {m} clients but clients = {k}; set clients = {m} "
                          f"or fix the file")
    return owner
