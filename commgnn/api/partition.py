"""``commgnn.partition_graph`` (``commgnn partition``): partition a graph once and save the
parts, for runs to read with ``partition.dir`` (``--partition-dir``).

The verb is ``partition_graph``, not ``partition``: ``commgnn.partition`` is the subpackage
of partitioners, and a lazy attribute of that name would hide it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from commgnn.errors import ConfigError
from commgnn.runner.config import RunConfig, resolve_config


@dataclass(frozen=True)
class PartitionResult:
    """A saved partition directory and its quality report."""

    dir: Path
    """The partition directory (``meta.json`` and one file per part)."""
    parts: int
    """Number of parts."""
    report: dict[str, Any]
    """The partition's quality report (edge cut, balance, halo sizes) as a plain dict."""
    text: str
    """The report as ``commgnn partition`` prints it."""


def _partition(cfg: RunConfig, out: Path, graph: Any = None) -> PartitionResult:
    """Partition ``cfg``'s graph (or the ``graph`` given in Python, recorded in ``meta.json``
    by its fingerprint as a run records it) and save the parts to ``out``; a graph folder
    out of core, one folder per rank (:mod:`commgnn.runner.folder_graph`)."""
    from commgnn.data import fingerprint, load_dataset
    from commgnn.partition import PartitionReport, build_local_partitions, format_report, save_partitions
    from commgnn.runner.folder_graph import (check_folder, graph_folder, method_for_folder, parts_for_folder,
                                             write_folder_partitions)
    from commgnn.runner.prepare import partition_for_run, partition_meta
    from commgnn.runner.run_dir import record_given_graph

    cfg = replace(cfg, partition=replace(cfg.partition, dir=None))
    folder = graph_folder(cfg, graph)
    if folder is not None:  # out of core: the graph is streamed, never loaded
        fp, described = check_folder(cfg, folder)
        cfg = method_for_folder(cfg, folder)
        parts_np = parts_for_folder(cfg, folder, Path(out))
        report = write_folder_partitions(folder, parts_np, cfg.runtime.parts, Path(out),
                                         {**partition_meta(cfg, fp, {}), "graph": described},
                                         features=cfg.partition.features)
        return PartitionResult(dir=Path(out), parts=cfg.runtime.parts, report=report,
                               text=format_report(PartitionReport.from_dict(report)))
    data = load_dataset(cfg.data, graph)
    fp = fingerprint(data)
    if graph is not None:
        cfg = record_given_graph(cfg, fp)
    parts, report = partition_for_run(cfg, data, fp)
    save_partitions(out, build_local_partitions(data, parts, cfg.runtime.parts),
                    partition_meta(cfg, fp, report, data))
    return PartitionResult(dir=Path(out), parts=cfg.runtime.parts, report=report, text=format_report(PartitionReport.from_dict(report)))


def partition_graph(out: str | Path, data: Any = None, *, parts: int | None = None,
                    config: RunConfig | str | Path | None = None, env: Mapping[str, str] | None = None,
                    **options: Any) -> PartitionResult:
    """Partition a graph into ``parts`` parts (default: the config's, 2) and save them to
    ``out``.

    Args:
        out: the partition directory to write.
        data: a dataset name or a ``.pt`` graph (default: the config's), or a graph given
            in Python as :func:`commgnn.train` takes it (a PyG ``Data``, a dict of tensors,
            an ``InMemoryDataset``); ``meta.json`` then names it by its fingerprint.
        parts: number of parts P.
        config: a :class:`RunConfig` or a TOML file to start from.
        env: where ``COMMGNN_DATA_ROOT`` is looked up (default ``os.environ``).
        **options: run options by keyword (:data:`commgnn.runner.config.RUN_OPTIONS`), e.g.
            ``partitioner="ldg"``, ``partition_seed=1``, ``objective="vol"``.
    """
    given, graph = dict(options), None
    if isinstance(data, (str, Path)):
        given["dataset"] = str(data)
    elif data is not None:
        graph = data
    if parts is not None:
        given["parts"] = parts
    if isinstance(config, RunConfig):
        cfg = resolve_config(None, given, os.environ if env is None else env, start=config)
    elif config is None or isinstance(config, (str, Path)):
        cfg = resolve_config(str(config) if config else None, given, os.environ if env is None else env)
    else:
        raise ConfigError(f"config= takes a RunConfig or a TOML path, got {type(config).__name__}")
    return _partition(cfg, Path(out), graph)
