"""The run folder: its default name, the manifest and ``config.toml`` header, writing it
through a hidden staging sibling, and ``status.json`` for a run that stopped.

Everything here writes or reads the run folder only; preparing the graph
(:mod:`~commgnn.runner.prepare`) and starting the ranks (:mod:`~commgnn.runner.local`,
:mod:`~commgnn.runner.torchrun`) are elsewhere.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

import torch

from commgnn.config import dump_toml, to_dict
from commgnn.errors import UserError
from commgnn.partition import build_local_partitions, save_partitions
from commgnn.report import (commit_out_dir, git_commit, host_info, library_versions, prepare_out_dir,
                            read_json, write_json, write_status)
from commgnn.report.records import STATUS
from commgnn.runner.config import RunConfig
from commgnn.runner.preflight import check_disk, estimate_run_bytes


def default_out_dir(cfg: RunConfig, *, data_name: str | None = None, model_name: str | None = None) -> Path:
    """``runs/<time>-<data>-<model>-p<parts>``. ``data_name``/``model_name`` name what ran
    when it is not what ``cfg`` names (a graph or a model given in Python)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = data_name or (Path(cfg.data.dataset).stem if cfg.data.dataset.endswith(".pt") else cfg.data.dataset)
    return Path("runs") / f"{stamp}-{name}-{model_name or cfg.model.name}-p{cfg.runtime.parts}"


def describe_graph(cfg: RunConfig, data: Any, fp: str) -> dict[str, Any]:
    """The manifest's ``dataset`` entry for a loaded graph."""
    return {"name": getattr(data, "name", cfg.data.dataset), "fingerprint": fp,
            "num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.shape[1]),
            "num_features": int(data.x.shape[1]), "num_classes": int(data.num_classes_total),
            **getattr(data, "graph_notes", {})}


def describe_from_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``dataset`` entry from a partition directory's ``meta.json`` (the graph
    itself is not loaded)."""
    if isinstance(meta.get("graph"), dict):
        return dict(meta["graph"])
    return {"name": meta.get("dataset"), "fingerprint": meta["graph_fingerprint"],
            **{k: meta[k] for k in ("num_nodes", "num_edges", "num_features", "num_classes") if k in meta}}


def manifest(cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any], torchrun: bool) -> dict[str, Any]:
    """``manifest.json``: when, how and on what the run was started."""
    return {
        "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "argv": sys.argv,
        "versions": library_versions(),
        "git_commit": git_commit(),
        "host": host_info(),
        "seed": cfg.train.seed,
        "dataset": graph,
        "partition": {"method": cfg.partition.method, "objective": cfg.partition.objective,
                      "seed": cfg.partition.seed, "dir": cfg.partition.dir, "reorder": cfg.partition.reorder,
                      "report": report},
        "launch": {"parts": cfg.runtime.parts, "torchrun": torchrun, "backend": cfg.runtime.backend},
    }


def write_header(staging: Path, cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any],
                 torchrun: bool) -> None:
    """``config.toml`` and ``manifest.json`` into ``staging``."""
    (staging / "config.toml").write_text(dump_toml(to_dict(cfg)))
    write_json(staging / "manifest.json", manifest(cfg, graph, report, torchrun))


def write_run_dir(cfg: RunConfig, out: Path, data: Any, graph: dict[str, Any],
                  parts: torch.Tensor | None, report: dict[str, Any], meta: dict[str, Any] | None) -> None:
    """Write the run directory through a hidden staging sibling (nothing half-written):
    its header and, when ``parts`` are given, ``partitions/`` with ``meta`` as its
    ``meta.json``. ``data`` (the loaded graph) is needed only when ``parts`` are to be saved.
    Refuses in one line when the disk is too small or the folder cannot be written."""
    P = cfg.runtime.parts
    part_bytes = 0.0
    if parts is not None:  # features (with halo copies) and edges, saved once per rank
        part_bytes = 1.5 * data.x.numel() * data.x.element_size() + 16.0 * data.edge_index.shape[1]
    params = ((graph.get("num_features", 0) + graph.get("num_classes", 0)) * cfg.model.hidden
              + cfg.model.layers * cfg.model.hidden ** 2)
    check_disk(out, estimate_run_bytes(partition_bytes=part_bytes, epochs=cfg.train.epochs,
                                       param_count=int(params), parts=P,
                                       checkpoint_every=cfg.runtime.checkpoint_every))
    staging = prepare_out_dir(out)
    try:
        write_header(staging, cfg, graph, report, torchrun=False)
        if parts is not None:
            save_partitions(staging / "partitions", build_local_partitions(data, parts, P), meta or {})
        commit_out_dir(staging, out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"cannot write the run directory {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def mark_ended(out: Path, state: str, **extra: Any) -> None:
    """Record ``state`` for a run that is not (or no longer) finished: ``summary.json``
    exists only for finished runs."""
    if out.is_dir():
        (out / "summary.json").unlink(missing_ok=True)
    write_status(out, state, **extra)


def previous_attempt(out: Path) -> int:
    """The attempt number recorded in ``status.json`` (0 for a run never resumed)."""
    try:
        return int(read_json(out / STATUS).get("attempt", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
