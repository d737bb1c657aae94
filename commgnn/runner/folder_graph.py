"""A graph folder as a run's input: the launcher never loads the graph.

When ``data.dataset`` names a graph folder (:mod:`commgnn.data.ondisk`), ``commgnn train``
and ``commgnn partition`` take this path instead of loading a PyG ``Data``:

1. the folder is streamed once (:func:`~commgnn.data.ondisk_check.check_graph_folder`): a
   bad file is one line naming it and its first bad chunk, before anything is written;
   the same pass hashes every file, and the hashes make the graph's fingerprint;
2. the parts are chosen with bounded memory (:func:`~commgnn.partition.ooc.folder_parts`):
   METIS, the default, where its estimate fits ``partition.memory_limit_gb`` (0: the
   memory available now), else ``lp-metis`` out of core, said on standard error;
3. one folder per rank is written out of core into the run's ``partitions/``
   (:func:`~commgnn.partition.folders.write_partition_folders`), and each rank
   memory-maps its own folder only.

An OGB raw folder is not a graph folder: it loads in memory through ``ogb``'s reader
(``commgnn datasets convert-ogb`` turns one that does not fit into a graph folder).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import numpy as np

from commgnn.data.datasets import is_folder_path
from commgnn.data.ondisk import GraphFolder, is_graph_folder, open_graph_folder
from commgnn.data.ondisk_check import check_graph_folder
from commgnn.distributed.forkserver import in_forked_rank, start_context
from commgnn.errors import ConfigError, UserError
from commgnn.partition import load_meta
from commgnn.partition.api import partition_memory_gb
from commgnn.partition.folders import write_partition_folders
from commgnn.partition.ooc import folder_parts
from commgnn.runner.config import RunConfig
from commgnn.distributed.memory import available_bytes

OUT_OF_CORE = "lp-metis"
"""The method that replaces METIS when METIS would not fit."""


def graph_folder(cfg: RunConfig, graph: Any = None) -> GraphFolder | None:
    """The run's graph folder, opened (headers only), when ``data.dataset`` names one and
    no graph was given in Python; None otherwise. Settings that would need the graph in
    memory are refused in one line."""
    if graph is not None or not is_folder_path(cfg.data.dataset):
        return None
    path = Path(cfg.data.dataset).expanduser()
    if not is_graph_folder(path):
        return None
    if cfg.data.normalize_features:
        raise ConfigError("data.normalize_features is not applied to a graph folder (its rows are read as "
                          "stored); normalise x.npy when writing the folder, or drop --normalize-features")
    return open_graph_folder(path)


def check_folder(cfg: RunConfig, folder: GraphFolder) -> tuple[str, dict[str, Any]]:
    """Stream-check ``folder`` once; ``(fingerprint, the manifest's dataset entry)``."""
    check = check_graph_folder(folder.path, allow_overlap=cfg.data.allow_mask_overlap)
    return check.fingerprint, describe_folder(folder, check.fingerprint)


def describe_folder(folder: GraphFolder, fp: str) -> dict[str, Any]:
    """The manifest's ``dataset`` entry of a graph folder (from ``meta.json``)."""
    return {"name": str(folder.meta.get("name") or folder.path.name), "fingerprint": fp,
            "num_nodes": folder.num_nodes, "num_edges": folder.num_edges, "num_features": folder.num_features,
            "num_classes": folder.num_classes, "format": "graph folder", "path": str(folder.path.resolve()),
            "feature_bytes": int(folder.x.dtype.itemsize)}


def method_for_folder(cfg: RunConfig, folder: GraphFolder) -> RunConfig:
    """``cfg`` with ``partition.method = "lp-metis"`` when METIS (the default) would exceed
    ``partition.memory_limit_gb`` (0: available memory) on this graph; said on stderr."""
    p = cfg.partition
    if p.method != "metis":
        return cfg
    cap = p.memory_limit_gb or available_bytes() / 2**30
    need = partition_memory_gb("metis", folder.num_nodes, folder.num_edges)
    if need <= cap:
        return cfg
    print(f"commgnn: METIS needs about {need:.1f} GB for {folder.num_edges:,} edges, over the {cap:.1f} GB "
          f"cap: partitioning out of core with {OUT_OF_CORE}", file=sys.stderr)
    return replace(cfg, partition=replace(p, method=OUT_OF_CORE))


def scratch_dir(near: Path) -> Path:
    """A hidden scratch folder beside ``near`` (same disk: the out-of-core CSR and edge
    buckets are as large as the edge list); the caller removes it."""
    near.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{near.name}.scratch-", dir=near.parent))


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a child process (the launch's fork server where there is one), its
    result or its exception returned here. Partitioning out of core frees most of what it
    allocates, but the allocator keeps much of it mapped in the process; run in a child, all
    of it goes back to the system when the child exits, before any rank starts. A child the
    kernel kills (the memory cap) is one line naming the step."""
    with ProcessPoolExecutor(max_workers=1, mp_context=start_context(cuda=False), initializer=in_forked_rank) as pool:
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            raise UserError(f"the out-of-core partitioning process died ({fn.__name__}); was it killed for "
                            f"memory? See partition.memory_limit_gb and --partitioner") from None


def _parts_job(path: str, cfg: RunConfig, near: str) -> np.ndarray:
    scratch = scratch_dir(Path(near))
    try:
        return folder_parts(open_graph_folder(path), cfg.runtime.parts, cfg.partition, workdir=scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def parts_for_folder(cfg: RunConfig, folder: GraphFolder, near: Path) -> np.ndarray:
    """``[N]`` part ids of the folder's nodes by ``cfg.partition`` (bounded memory, in a
    child process: :func:`in_child`)."""
    return in_child(_parts_job, str(folder.path), cfg, str(near))  # type: ignore[no-any-return]


def _write_job(path: str, parts: np.ndarray, num_parts: int, dest: str, meta: dict[str, Any],
               copy_features: bool) -> dict[str, Any]:
    scratch = scratch_dir(Path(dest))
    try:
        out = write_partition_folders(open_graph_folder(path), parts, num_parts, dest, meta=meta, workdir=scratch,
                                      copy_features=copy_features)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dict(load_meta(out)["report"])


def write_folder_partitions(folder: GraphFolder, parts: np.ndarray, num_parts: int, dest: Path,
                            meta: dict[str, Any], *, features: str = "copy") -> dict[str, Any]:
    """Write the version-2 partition directory ``dest`` out of core (in a child process:
    :func:`in_child`); its report. ``features``: ``partition.features``."""
    return in_child(_write_job, str(folder.path), parts, num_parts, str(dest), meta,  # type: ignore[no-any-return]
                    features == "copy")


def folder_partition_bytes(folder: GraphFolder, features: str = "copy") -> float:
    """Disk the partition folders take: every feature row once (``features = "copy"``),
    plus the halo plan and the in-CSR (at most 8 bytes per edge index) and per-node arrays."""
    x = float(folder.x.nbytes) if features == "copy" else 0.0
    return x + 8.0 * folder.num_edges + 64.0 * folder.num_nodes
