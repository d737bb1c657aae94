"""``commgnn train``: prepare a run, start the ranks, record what they did.

Two launch paths share one per-rank loop (:func:`run_rank`):

* **local** (``--parts P``, no torchrun variables): this process loads and validates the
  graph, partitions it, writes the run directory (with ``partitions/``) and only then
  spawns P ranks, each loading its own partition file. Bad input fails before anything
  is written.
* **torchrun** (``RANK``/``WORLD_SIZE`` set): every rank loads the graph and partitions it
  the same way (deterministic by seed), or loads ``--partition-dir``; rank 0 writes the
  run directory. Ranks agree that preparation succeeded before training starts.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch

from commgnn.cli.config import RunConfig, config_dict
from commgnn.config import dump_toml
from commgnn.data import fingerprint, load_dataset
from commgnn.dist.context import (DistContext, LaunchInfo, check_port_free, free_port, init_distributed,
                                  launch_info_from_env, shutdown)
from commgnn.dist.events import Hooks
from commgnn.dist.launch import spawn_ranks
from commgnn.errors import PartitionError, UserError
from commgnn.metrics import Meter
from commgnn.partition import (LocalPartition, build_local_partition, build_local_partitions, load_meta,
                               load_partition, partition_graph, partition_report, save_partitions)
from commgnn.report import (EpochProgress, MetricsLog, commit_out_dir, git_commit, host_info,
                            library_versions, prepare_out_dir, print_summary, summarise, write_json)
from commgnn.report.records import read_json
from commgnn.trainers import FullGraphTrainer


def default_out_dir(cfg: RunConfig) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = Path(cfg.data.dataset).stem if cfg.data.dataset.endswith(".pt") else cfg.data.dataset
    return Path("runs") / f"{stamp}-{name}-{cfg.model.name}-p{cfg.runtime.parts}"


def _manifest(cfg: RunConfig, data: Any, fp: str, report: dict[str, Any], torchrun: bool) -> dict[str, Any]:
    return {
        "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "argv": sys.argv,
        "versions": library_versions(),
        "git_commit": git_commit(),
        "host": host_info(),
        "seed": cfg.train.seed,
        "dataset": {"name": getattr(data, "name", cfg.data.dataset), "fingerprint": fp,
                    "num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.shape[1]),
                    "num_features": int(data.x.shape[1]), "num_classes": int(data.num_classes_total)},
        "partition": {"method": cfg.partition.method, "objective": cfg.partition.objective,
                      "seed": cfg.partition.seed, "dir": cfg.partition.dir, "report": report},
        "launch": {"parts": cfg.runtime.parts, "torchrun": torchrun, "backend": cfg.runtime.backend},
    }


def _partition(cfg: RunConfig, data: Any, fp: str) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """Part ids (None when a saved directory is used) and the partition report."""
    P = cfg.runtime.parts
    if cfg.partition.dir:
        meta = load_meta(cfg.partition.dir)
        for r in range(P):  # check every file now, before anything is written
            load_partition(cfg.partition.dir, r, expected_fingerprint=fp, expected_parts=P)
        return None, meta.get("report", {})
    if P > data.num_nodes:
        raise PartitionError(f"cannot split {data.num_nodes} nodes into {P} partitions")
    parts = partition_graph(data.edge_index, data.num_nodes, P, cfg.partition)
    report = partition_report(data.edge_index, parts, P, data.train_mask).to_dict()
    return parts, report


def _write_header(staging: Path, cfg: RunConfig, data: Any, fp: str, report: dict[str, Any],
                  torchrun: bool) -> None:
    (staging / "config.toml").write_text(dump_toml(config_dict(cfg)))
    write_json(staging / "manifest.json", _manifest(cfg, data, fp, report, torchrun))


def train_local(cfg: RunConfig) -> dict[str, Any]:
    """Run P local ranks; return the summary."""
    P, rt = cfg.runtime.parts, cfg.runtime
    if P > 1:
        if rt.port:
            check_port_free(rt.master_addr, rt.port)
        else:
            cfg = replace(cfg, runtime=replace(rt, port=free_port(rt.master_addr)))
    data = load_dataset(cfg.data)
    fp = fingerprint(data)
    parts, report = _partition(cfg, data, fp)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    staging = prepare_out_dir(out)
    try:
        _write_header(staging, cfg, data, fp, report, torchrun=False)
        if parts is not None:
            meta = {"graph_fingerprint": fp, "method": cfg.partition.method,
                    "objective": cfg.partition.objective, "seed": cfg.partition.seed, "report": report}
            save_partitions(staging / "partitions", build_local_partitions(data, parts, P), meta)
        commit_out_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    part_dir = cfg.partition.dir or str(out / "partitions")
    del data, parts
    args = (cfg, str(out), part_dir, fp, report)
    try:
        if P == 1:
            _local_rank(LaunchInfo(rank=0, world_size=1, local_rank=0, local_world_size=1,
                                   master_addr=rt.master_addr, port=0), *args)
        else:
            spawn_ranks(_local_rank, args, nprocs=P, master_addr=rt.master_addr, port=cfg.runtime.port)
    except UserError:
        shutil.rmtree(out, ignore_errors=True)  # bad input found late: leave nothing behind
        raise
    return read_json(out / "summary.json")


def _local_rank(info: LaunchInfo, cfg: RunConfig, out: str, part_dir: str, fp: str,
                report: dict[str, Any]) -> None:
    ctx = init_distributed(info, cfg.runtime)
    try:
        part = load_partition(part_dir, ctx.rank, expected_fingerprint=fp, expected_parts=ctx.world_size)
        run_rank(ctx, cfg, part, Path(out), report)
    finally:
        shutdown(ctx)


def _agree(ctx: DistContext, ok: bool) -> bool:
    """True when every rank reports success (one tiny all-reduce)."""
    flag = torch.tensor([0.0 if ok else 1.0])
    return float(ctx.all_reduce(flag, "max")) == 0.0


def train_torchrun(cfg: RunConfig, info: LaunchInfo) -> dict[str, Any] | None:
    """This process is one rank of a torchrun job; rank 0 returns the summary."""
    cfg = replace(cfg, runtime=replace(cfg.runtime, parts=info.world_size))
    ctx = init_distributed(info, cfg.runtime)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    error: BaseException | None = None
    part: LocalPartition | None = None
    report: dict[str, Any] = {}
    try:
        data = load_dataset(cfg.data)
        fp = fingerprint(data)
        parts, report = _partition(cfg, data, fp)
        if parts is None:
            part = load_partition(cfg.partition.dir, ctx.rank, expected_fingerprint=fp,
                                  expected_parts=ctx.world_size)
        else:
            part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
        if ctx.is_main:
            staging = prepare_out_dir(out)
            _write_header(staging, cfg, data, fp, report, torchrun=True)
            commit_out_dir(staging, out)
        del data
    except UserError as exc:
        error = exc
    try:
        if not _agree(ctx, error is None):
            raise error if error is not None else UserError("another rank failed while preparing the run")
        run_rank(ctx, cfg, part, out, report)  # type: ignore[arg-type]
    finally:
        shutdown(ctx)
    return read_json(out / "summary.json") if ctx.is_main else None


def run_rank(ctx: DistContext, cfg: RunConfig, part: LocalPartition, out: Path,
             report: dict[str, Any]) -> None:
    """Train on this rank's partition; rank 0 logs every epoch and writes the summary."""
    hooks = Hooks()
    meter = Meter(ctx, cfg.model.layers)
    hooks.subscribe(meter)
    trainer = FullGraphTrainer(ctx, part, cfg.model, cfg.train, hooks)
    log = MetricsLog(out / "metrics.jsonl") if ctx.is_main else None
    rows: list[dict[str, Any]] = []
    show = ctx.is_main and not cfg.output.quiet
    with EpochProgress(cfg.train.epochs, enabled=show) as progress:
        for res in trainer.run():
            traffic = meter.end_epoch(res.time_s)
            row = {"epoch": res.epoch, "loss": res.loss, "train_acc": res.train_acc,
                   "val_acc": res.val_acc, "test_acc": res.test_acc, **traffic.to_dict()}
            rows.append(row)
            if log:
                log.write(row)
            progress.update(row)
    totals = meter.totals()
    if log:
        log.close()
        summary = summarise(dataset=cfg.data.dataset, model=cfg.model.name, parts=ctx.world_size,
                            rows=rows, totals=totals, partition=report)
        write_json(out / "summary.json", summary)
        if show:
            print_summary(summary, str(out))


def train_command(cfg: RunConfig, env: Mapping[str, str]) -> dict[str, Any] | None:
    info = launch_info_from_env(env)
    if info is not None:
        return train_torchrun(cfg, info)
    return train_local(cfg)
