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
import hashlib
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch

from commgnn.cli.config import RunConfig
from commgnn.config import dump_toml, to_dict
from commgnn.data import fingerprint, load_dataset
from commgnn.dist.context import (DistContext, LaunchInfo, check_port_free, free_port, init_distributed,
                                  launch_info_from_env, shutdown)
from commgnn.dist.events import Hooks
from commgnn.dist.launch import spawn_ranks
from commgnn.errors import PartitionError, RankFailure, UserError
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


def partition_meta(cfg: RunConfig, fp: str, report: dict[str, Any]) -> dict[str, Any]:
    """``meta.json`` content of a partition directory made for this run."""
    return {"graph_fingerprint": fp, "dataset": cfg.data.dataset, "method": cfg.partition.method,
            "objective": cfg.partition.objective, "seed": cfg.partition.seed, "report": report}


def partition_for_run(cfg: RunConfig, data: Any, fp: str) -> tuple[torch.Tensor | None, dict[str, Any]]:
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
    (staging / "config.toml").write_text(dump_toml(to_dict(cfg)))
    write_json(staging / "manifest.json", _manifest(cfg, data, fp, report, torchrun))


def train_local(cfg: RunConfig) -> dict[str, Any]:
    """Run P local ranks; return the summary."""
    P, rt = cfg.runtime.parts, cfg.runtime
    port = rt.port  # the config keeps the user's value (0 = pick), so it can be rerun
    if P > 1:
        if port:
            check_port_free(rt.master_addr, port)
        else:
            port = free_port(rt.master_addr)
    data = load_dataset(cfg.data)
    fp = fingerprint(data)
    parts, report = partition_for_run(cfg, data, fp)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    staging = prepare_out_dir(out)
    try:
        _write_header(staging, cfg, data, fp, report, torchrun=False)
        if parts is not None:
            save_partitions(staging / "partitions", build_local_partitions(data, parts, P),
                            partition_meta(cfg, fp, report))
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
            spawn_ranks(_local_rank, args, nprocs=P, master_addr=rt.master_addr, port=port)
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


def _agree(ctx: DistContext, ok: bool, *checks: str) -> bool:
    """True when every rank succeeded and all ranks hold the same ``checks`` strings
    (fingerprints of the graph and the partition: ranks that partitioned on their own
    must have got the same answer, or the exchange splits would not line up)."""
    digest = int(hashlib.sha256("|".join(checks).encode()).hexdigest()[:12], 16) if ok else -1
    lo = ctx.all_reduce(torch.tensor([float(digest)], dtype=torch.float64), "min")
    hi = ctx.all_reduce(torch.tensor([float(digest)], dtype=torch.float64), "max")
    return bool(lo[0] == hi[0]) and digest >= 0


def train_torchrun(cfg: RunConfig, info: LaunchInfo) -> dict[str, Any] | None:
    """This process is one rank of a torchrun job; rank 0 returns the summary.

    The world size comes from torchrun; ``runtime.parts`` is replaced by it.
    """
    cfg = replace(cfg, runtime=replace(cfg.runtime, parts=info.world_size))
    ctx = init_distributed(info, cfg.runtime)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    error: BaseException | None = None
    part: LocalPartition | None = None
    report: dict[str, Any] = {}
    checks: tuple[str, ...] = ()
    try:
        data = load_dataset(cfg.data)
        fp = fingerprint(data)
        if cfg.partition.dir:
            report = load_meta(cfg.partition.dir).get("report", {})
            part = load_partition(cfg.partition.dir, ctx.rank, expected_fingerprint=fp,
                                  expected_parts=ctx.world_size)
            checks = (fp,)
        else:
            parts, report = partition_for_run(cfg, data, fp)
            part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
            checks = (fp, hashlib.sha256(parts.numpy().tobytes()).hexdigest())
    except Exception as exc:  # every rank must reach the agreement below
        error = exc
    try:
        if not _agree(ctx, error is None, *checks):
            if error is not None:
                raise error
            raise UserError("ranks disagree on the graph or its partition (different data or "
                            "library versions on different hosts?); pass a shared --partition-dir")
        staging = None
        if ctx.is_main:
            try:
                staging = prepare_out_dir(out)
                _write_header(staging, cfg, data, fp, report, torchrun=True)
                commit_out_dir(staging, out)
            except Exception as exc:
                error = exc
        if not _agree(ctx, error is None):
            if error is not None:
                if staging is not None:
                    shutil.rmtree(staging, ignore_errors=True)
                raise error
            raise UserError("rank 0 could not write the run directory")
        del data
        try:
            run_rank(ctx, cfg, part, out, report)  # type: ignore[arg-type]
        except torch.distributed.DistError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankFailure(f"rank {ctx.rank}: a collective failed, so a peer rank died or timed "
                              f"out ({first}); torchrun's report names the rank that exited first") from None
    finally:
        shutdown(ctx)
    return read_json(out / "summary.json") if ctx.is_main else None


def run_rank(ctx: DistContext, cfg: RunConfig, part: LocalPartition, out: Path,
             report: dict[str, Any]) -> None:
    """Train on this rank's partition; rank 0 logs every epoch and writes the summary."""
    hooks = Hooks()
    meter = Meter(ctx, cfg.model.layers)
    hooks.subscribe(meter)
    trainer = FullGraphTrainer(ctx, part, cfg.model, cfg.train, hooks, comm_cfg=cfg.comm)
    meter.end_setup()  # set-up traffic is reported apart from the epochs
    log = MetricsLog(out / "metrics.jsonl") if ctx.is_main else None
    rows: list[dict[str, Any]] = []
    show = ctx.is_main and not cfg.output.quiet
    try:
        with EpochProgress(cfg.train.epochs, enabled=show) as progress:
            for res in trainer.run():
                traffic = meter.end_epoch(res.time_s)
                row = {"epoch": res.epoch, "loss": res.loss, "train_acc": res.train_acc,
                       "val_acc": res.val_acc, "test_acc": res.test_acc, **traffic.to_dict(),
                       **trainer.halo.epoch_log()}
                if res.consensus is not None:
                    row["consensus_distance"] = res.consensus
                rows.append(row)
                if log:
                    log.write(row)
                progress.update(row)
    finally:
        if log:
            log.close()
    totals = meter.totals()
    if log:
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
