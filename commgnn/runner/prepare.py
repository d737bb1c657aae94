"""Preparing a run before any rank starts: the graph's identity in a partition directory,
partitioning for the run, and the memory pre-flight check.

Bad input is found here, before the run folder is written (:mod:`~commgnn.runner.run_dir`)
or a rank is started (:mod:`~commgnn.runner.local`, :mod:`~commgnn.runner.torchrun`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from commgnn.config import to_dict
from commgnn.data.datasets import is_folder_path
from commgnn.data.ondisk_check import folder_identity
from commgnn.errors import PartitionError, UserError
from commgnn.partition import assign_parts, load_meta, load_partition, partition_report
from commgnn.partition.placement import place_partitions
from commgnn.runner.config import RunConfig
from commgnn.runner.preflight import check_memory, estimate_for_config
from commgnn.runner.run_dir import describe_from_meta, describe_graph
from commgnn.runner.step_probe import probe_graph_from_data, probe_graph_from_dir


def recorded_graph(cfg: RunConfig, graph: Any) -> tuple[str, dict[str, Any]] | None:
    """``(fingerprint, description)`` from ``partition.dir``'s ``meta.json`` when it records
    this run's ``[data]`` table (so the graph need not be loaded to check it); None when there
    is no directory, it predates the record, the data settings differ, or a graph was given
    in Python."""
    if not cfg.partition.dir or graph is not None:
        return None
    meta = load_meta(cfg.partition.dir)
    if meta.get("data") != data_table(cfg):
        return None
    return meta["graph_fingerprint"], describe_from_meta(meta)


def data_table(cfg: RunConfig) -> Any:
    """What identifies the run's graph in a partition directory's ``meta.json``: the
    ``[data]`` table as JSON reads it back, less the folders it is read and cached from
    (the same named dataset wherever it lies), and for a user's ``.pt`` file (or graph folder) its resolved
    path, size and modification time (of each file: a file rewritten in place is another graph)."""
    table = json.loads(json.dumps(to_dict(cfg.data)))
    for key in ("root", "cache_dir"):
        table.pop(key, None)
    if cfg.data.dataset.endswith(".pt"):
        path = Path(cfg.data.dataset).expanduser().resolve()
        try:
            st = path.stat()
            table["file"] = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        except OSError:
            table["file"] = {"path": str(path), "missing": True}
    elif is_folder_path(cfg.data.dataset):  # each file's size and mtime: a rewritten folder is another graph
        table["folder"] = folder_identity(Path(cfg.data.dataset).expanduser())
    return table


def partition_meta(cfg: RunConfig, fp: str, report: dict[str, Any], data: Any = None) -> dict[str, Any]:
    """``meta.json`` content of a partition directory made for this run (``data``: the
    graph, whose manifest description it records)."""
    described = {"graph": describe_graph(cfg, data, fp)} if data is not None else {}
    return {"graph_fingerprint": fp, "dataset": cfg.data.dataset, "data": data_table(cfg), **described,
            "method": cfg.partition.method,
            "objective": cfg.partition.objective, "seed": cfg.partition.seed, "hosts": cfg.partition.hosts,
            "report": report}


def partition_for_run(cfg: RunConfig, data: Any, fp: str) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """Part ids (None when a saved directory is used, whose every file is checked now) and
    the partition report."""
    P = cfg.runtime.parts
    if cfg.partition.dir:
        meta = load_meta(cfg.partition.dir)
        for r in range(P):  # check every file now, before anything is written
            load_partition(cfg.partition.dir, r, expected_fingerprint=fp, expected_parts=P)
        return None, meta.get("report", {})
    if P > data.num_nodes:
        raise PartitionError(f"cannot split {data.num_nodes} nodes into {P} partitions")
    parts = assign_parts(data.edge_index, data.num_nodes, P, cfg.partition)
    placement = None
    if cfg.partition.hosts > 1:
        if P % cfg.partition.hosts:
            raise PartitionError(f"partition.hosts = {cfg.partition.hosts} does not divide {P} ranks evenly")
        parts, placement = place_partitions(data.edge_index, parts, P, cfg.partition.hosts)
    report = partition_report(data.edge_index, parts, P, data.train_mask).to_dict()
    if placement is not None:
        report["placement"] = placement
    return parts, report


def preflight_memory(cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any], *, own: bool,
                     data: Any = None, parts: torch.Tensor | None = None) -> None:
    """Refuse (:class:`~commgnn.errors.UserError`, one line with the estimate) a job whose
    estimate exceeds the memory cap. A neighbour-sampling or VR-GCN run that the overlap-free
    bound refuses is estimated again from a sampled probe of its steps
    (:mod:`~commgnn.runner.step_probe`): the bound counts every sampled neighbour as new and
    refuses runs that fit several times over, and the probe costs a CSR of the graph, so it
    runs only when the bound says no. ``own``: the user's own model (estimated as one)."""
    est = estimate_for_config(cfg, graph, report, own=own)
    if est is None:
        return
    try:
        check_memory(est, limit_gb=cfg.runtime.memory_limit_gb)
    except UserError:
        probe = None
        if cfg.train.mode == "minibatch" and cfg.minibatch.sampler in ("neighbor", "vrgcn"):
            P = cfg.runtime.parts
            probe = probe_graph_from_data(data, parts, P) if parts is not None and data is not None \
                else probe_graph_from_dir(cfg.partition.dir, P) if cfg.partition.dir else None
        if probe is None:
            raise
        probed = estimate_for_config(cfg, graph, report, own=own, probe=probe)
        assert probed is not None  # the same report and graph gave an estimate above
        check_memory(probed, limit_gb=cfg.runtime.memory_limit_gb)
