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
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from commgnn.config import dump_toml, to_dict
from commgnn.data.datasets import is_folder_path
from commgnn.errors import UserError
from commgnn.partition import build_local_partitions, save_partitions
from commgnn.report import (commit_out_dir, git_commit, host_info, library_versions, prepare_out_dir,
                            read_json, write_json, write_status)
from commgnn.report.records import STATUS
from commgnn.report.runs import cut_record
from commgnn.runner.config import RunConfig
from commgnn.runner.folder_graph import folder_partition_bytes, write_folder_partitions
from commgnn.runner.own_model import write_own_model
from commgnn.runner.preflight import check_disk, estimate_run_bytes


GIVEN_PREFIX = "python:"
"""``data.dataset`` of a run that trained on a graph given in Python: ``python:`` and the
start of the graph's fingerprint. It names what ran; no file or registry holds it."""


def given_graph_name(fp: str) -> str:
    """``data.dataset`` recorded for a graph given in Python with fingerprint ``fp``."""
    return f"{GIVEN_PREFIX}{fp[:16]}"


def is_given_graph(cfg: RunConfig) -> bool:
    """True when ``cfg`` records a graph given in Python (it cannot be loaded by name)."""
    return cfg.data.dataset.startswith(GIVEN_PREFIX)


def record_given_graph(cfg: RunConfig, fp: str) -> RunConfig:
    """``cfg`` with ``data.dataset`` naming the graph given in Python that it trains on."""
    return replace(cfg, data=replace(cfg.data, dataset=given_graph_name(fp)))


def default_out_dir(cfg: RunConfig, *, graph: Any = None, module: nn.Module | None = None) -> Path:
    """``runs/<time>-<data>-<model>-p<parts>``, naming what runs: ``python`` for a graph
    given in Python (``graph``), the class name of the user's own model (``module``)."""
    model = type(module).__name__ if module is not None else cfg.model.name
    return Path("runs") / f"{time_stamp()}-{graph_label(cfg, graph)}-{model}-p{cfg.runtime.parts}"


def time_stamp() -> str:
    """The local time as a default run folder name holds it (``YYYYmmdd-HHMMSS``)."""
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def graph_label(cfg: Any, graph: Any = None) -> str:
    """The graph's name in a default run folder name: ``python`` for a graph given in Python
    (``graph``, or ``cfg.data.dataset`` recording one), a ``.pt`` file's stem, else the
    dataset's name (a folder's own name). ``cfg`` is any config with a ``data`` section."""
    if graph is not None or cfg.data.dataset.startswith(GIVEN_PREFIX):
        return "python"
    if cfg.data.dataset.endswith(".pt"):
        return Path(cfg.data.dataset).stem
    if is_folder_path(cfg.data.dataset):  # a graph folder or OGB raw folder: its own name
        return Path(cfg.data.dataset).expanduser().resolve().name or "folder"
    return cfg.data.dataset


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


def model_entry(cfg: RunConfig, own: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manifest's ``model`` entry: the built-in model's name and size, or the user's own
    model's class (``own``: :func:`~commgnn.runner.own_model.describe_own_model`)."""
    if own is not None:
        return {"name": own["class"], "own": True, "module": own["module"], "qualname": own["qualname"],
                "init": own.get("init")}
    return {"name": cfg.model.name, "own": False, "layers": cfg.model.layers, "hidden": cfg.model.hidden}


def rerun_notes(cfg: Any, own: Mapping[str, Any] | None = None) -> list[str]:
    """Why ``config.toml`` alone cannot re-run this run (empty when it can); ``cfg`` is any
    config with a ``data`` section (a training or a federated run's)."""
    notes = []
    if cfg.data.dataset.startswith(GIVEN_PREFIX):
        notes.append(f"[data] dataset = {cfg.data.dataset!r} is a graph given in Python (its fingerprint is "
                     "in manifest.json); pass it again: commgnn.resume(run_dir, data), "
                     "commgnn.predict(run_dir, data)")
    if own is not None:
        notes.append(f"the model is your own {own['class']} ({own['module']}.{own['qualname']}, "
                     "recorded in own_model.json), not [model] name, layers and hidden below")
    return notes


def manifest(cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any], torchrun: bool,
             own: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``manifest.json``: when, how and on what the run was started (``own``: the user's
    own model, as :func:`model_entry` takes it)."""
    return {
        **base_manifest(),
        "seed": cfg.train.seed,
        "dataset": graph,
        "model": model_entry(cfg, own),
        "rerun": rerun_entry(rerun_notes(cfg, own)),
        "partition": {"method": cfg.partition.method, "objective": cfg.partition.objective,
                      "seed": cfg.partition.seed, "dir": cfg.partition.dir, "reorder": cfg.partition.reorder,
                      "report": report},
        "launch": launch_entry(cfg, torchrun),
    }


def base_manifest() -> dict[str, Any]:
    """The manifest entries of every run folder: ``started`` (now), ``argv``, ``versions``,
    ``git_commit`` and ``host``."""
    return {"started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "argv": sys.argv,
            "versions": library_versions(), "git_commit": git_commit(), "host": host_info()}


def launch_entry(cfg: Any, torchrun: bool) -> dict[str, Any]:
    """The manifest's ``launch`` entry (``cfg``: any config with a ``runtime`` section)."""
    return {"parts": cfg.runtime.parts, "torchrun": torchrun, "backend": cfg.runtime.backend}


def rerun_entry(notes: list[str]) -> dict[str, Any]:
    """The manifest's ``rerun`` entry for :func:`rerun_notes` ``notes``."""
    return {"from_config": False, "why": notes} if notes else {"from_config": True}


def config_text(cfg: Any, notes: list[str]) -> str:
    """``config.toml``'s text: ``cfg`` as TOML, under a comment header listing ``notes``
    (:func:`rerun_notes`) when there are any."""
    head = "".join(["# Not re-runnable from this file alone:\n", *(f"# - {n}\n" for n in notes), "\n"]) if notes else ""
    return head + dump_toml(to_dict(cfg))


def write_header(staging: Path, cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any],
                 torchrun: bool, own: Mapping[str, Any] | None = None) -> None:
    """``config.toml`` and ``manifest.json`` into ``staging``. A run that ``config.toml``
    alone cannot re-run (a graph given in Python, the user's own model) says so in comments
    at the top of the file, and in the manifest's ``rerun`` entry."""
    (staging / "config.toml").write_text(config_text(cfg, rerun_notes(cfg, own)))
    write_json(staging / "manifest.json", manifest(cfg, graph, report, torchrun, own))


def write_run_dir(cfg: RunConfig, out: Path, data: Any, graph: dict[str, Any],
                  parts: Any, report: dict[str, Any] | None, meta: dict[str, Any] | None,
                  own: Mapping[str, Any] | None = None, module: nn.Module | None = None, *,
                  folder: Any = None, check_report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Write the run directory through a hidden staging sibling (nothing half-written):
    its header, the user's own ``module`` (``own_model.json`` with ``own`` as its record,
    and ``own_model_init.pt``) when given and, when ``parts`` are given, ``partitions/``
    with ``meta`` as its ``meta.json``. ``data`` (the loaded graph) is needed only when
    ``parts`` are to be saved. With a graph ``folder`` (:mod:`~commgnn.runner.folder_graph`)
    instead of ``data``, ``parts`` is the ``[N]`` array of part ids and the rank folders are
    written out of core; their report (``report`` is None then) goes to ``check_report``
    (the memory pre-flight, which may refuse: nothing is left behind) before the header.
    Returns the partition report.
    Refuses in one line when the disk is too small or the folder cannot be written."""
    P = cfg.runtime.parts
    part_bytes = 0.0
    if parts is not None and folder is not None:
        part_bytes = folder_partition_bytes(folder, cfg.partition.features)
    elif parts is not None:  # features (with halo copies) and edges, saved once per rank
        part_bytes = 1.5 * data.x.numel() * data.x.element_size() + 16.0 * data.edge_index.shape[1]
    params = ((graph.get("num_features", 0) + graph.get("num_classes", 0)) * cfg.model.hidden
              + cfg.model.layers * cfg.model.hidden ** 2)
    check_disk(out, estimate_run_bytes(partition_bytes=part_bytes, epochs=cfg.train.epochs,
                                       param_count=int(params), parts=P,
                                       checkpoint_every=cfg.runtime.checkpoint_every))

    done: dict[str, Any] = dict(report or {})

    def write(staging: Path) -> None:
        if parts is not None and folder is not None:
            done.update(write_folder_partitions(folder, parts, P, staging / "partitions", meta or {},
                                                features=cfg.partition.features))
            if check_report is not None:
                check_report(done)
        write_header(staging, cfg, graph, done, torchrun=False, own=own)
        if module is not None:
            write_own_model(staging, module, dict(own) if own is not None else None)
        if parts is not None and folder is None:
            save_partitions(staging / "partitions", build_local_partitions(data, parts, P), meta or {})

    write_staged(out, write)
    return done


def write_staged(out: Path, write: Callable[[Path], None]) -> None:
    """Create the run folder ``out`` whole or not at all: ``write`` fills a hidden staging
    sibling, which is then renamed into place. A failure removes the staging folder; an
    ``OSError`` (a full disk, no permission) becomes one line naming ``out``."""
    staging = prepare_out_dir(out)
    try:
        write(staging)
        commit_out_dir(staging, out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"cannot write the run folder {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def mark_ended(out: Path, state: str, **extra: Any) -> None:
    """Record ``state`` for a run that is not (or no longer) finished: ``summary.json``
    exists only for finished runs."""
    if out.is_dir():
        (out / "summary.json").unlink(missing_ok=True)
    write_status(out, state, **extra)


def warn_cut_record(out: Path) -> None:
    """On resume: say in one line (standard error) when ``metrics.jsonl`` ends with a record
    cut short (a full disk); rank 0 keeps the whole records before it, up to the checkpoint."""
    cut = cut_record(out / "metrics.jsonl")
    if cut is not None:
        print(f"commgnn: warning: {cut}", file=sys.stderr, flush=True)


def previous_attempt(out: Path) -> int:
    """The attempt number recorded in ``status.json`` (0 for a run never resumed)."""
    try:
        return int(read_json(out / STATUS).get("attempt", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
