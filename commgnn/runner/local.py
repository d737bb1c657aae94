"""Local ranks (``--parts P``, no torchrun variables): this process loads and validates the
graph, partitions it, writes the run directory (with ``partitions/``) and only then spawns
P ranks, each loading its own partition file. Bad input fails before anything is written.

With a ``--partition-dir`` whose ``meta.json`` records the run's ``[data]`` table, the graph
is not loaded at all (the files carry their checksums; a directory made from other data
settings is checked against the loaded graph's fingerprint).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from commgnn.data import GIVEN_GRAPH, fingerprint, load_dataset
from commgnn.distributed.config import RuntimeConfig
from commgnn.distributed.context import LaunchInfo, check_port_free, free_port, init_distributed, shutdown
from commgnn.distributed.forkserver import prestart
from commgnn.distributed.spawn import first_line, spawn_ranks
from commgnn.errors import UserError
from commgnn.partition import load_partition
from commgnn.report import json_field, read_json, write_status
from commgnn.runner.config import RunConfig, config_from_partition_dir
from commgnn.runner.folder_graph import check_folder, graph_folder, method_for_folder, parts_for_folder
from commgnn.runner.own_model import carry_model, check_own_model, describe_own_model, load_own_model, unpack_model
from commgnn.runner.preflight import check_rank_count
from commgnn.runner.prepare import partition_for_run, partition_meta, preflight_memory, recorded_graph
from commgnn.runner.rank import run_rank
from commgnn.trainers import checkpoint
from commgnn.runner.run_dir import (default_out_dir, describe_graph, is_given_graph, mark_ended, previous_attempt,
                                    record_given_graph, warn_cut_record, write_run_dir)


def train_local(cfg: RunConfig, *, resume: bool = False, graph: Any = None,
                module: nn.Module | None = None) -> dict[str, Any]:
    """Run P local ranks; return the summary. With ``resume``, ``cfg.output.out`` is an
    existing run directory to continue from its newest checkpoint. ``graph``: a graph given
    in Python (PyG ``Data``, dict or ``InMemoryDataset``) instead of ``cfg.data.dataset``
    (recorded as ``data.dataset = "python:<fingerprint>"``). ``module``: the user's own model
    (on resume, one that replaces the recorded class: see :mod:`~commgnn.runner.own_model`)."""
    cfg = config_from_partition_dir(cfg)
    P, rt = cfg.runtime.parts, cfg.effective_runtime
    if module is not None and not resume:
        check_own_model(module, cfg)
    port, cuda = prepare_local_ranks(rt, P)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg, graph=graph, module=module)
    if graph is None and resume and json_field(out / "manifest.json", "dataset", "name") == GIVEN_GRAPH:
        raise UserError(f"{out} trained on a graph given in Python; resume it from Python with "
                        f"commgnn.resume({str(out)!r}, data)")
    if graph is None and is_given_graph(cfg):
        raise UserError(f"data.dataset = {cfg.data.dataset!r} names a graph given in Python to another run, "
                        f"which cannot be loaded by name; pass the graph: commgnn.train(data, config=...)")
    recorded = recorded_graph(cfg, graph)
    folder = graph_folder(cfg, graph) if recorded is None else None
    if recorded is not None:  # a partition directory made for this [data]: the graph is not needed
        data, (fp, described) = None, recorded
    elif folder is not None:  # a graph folder: streamed once to check and hash it, never loaded
        data, (fp, described) = None, check_folder(cfg, folder)
    else:
        data = load_dataset(cfg.data, graph)
        fp = fingerprint(data)
        described = describe_graph(cfg, data, fp)
    if graph is not None:  # what ran is recorded: config.toml, summary.json and the report name it
        cfg = record_given_graph(cfg, fp)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    if resume:
        parts, report = None, json_field(out / "manifest.json", "partition", "report", kind=dict)
        part_dir = cfg.partition.dir or str(out / "partitions")
        for r in range(P):
            load_partition(part_dir, r, expected_fingerprint=fp, expected_parts=P)
        checkpoint.verify(out, P)  # every rank's file against its sha256, before any rank starts
        warn_cut_record(out)
        attempt = previous_attempt(out) + 1
        module = load_own_model(out, module, verb=f"commgnn.resume({str(out)!r}, model=MODEL)")
        if module is not None:
            check_own_model(module, cfg)
        mark_ended(out, "running", resumed=True, attempt=attempt)
    else:
        own = describe_own_model(module) if module is not None else None
        if folder is not None and not cfg.partition.dir:  # out of core; the pre-flight reads the written report
            cfg = method_for_folder(cfg, folder)
            parts = parts_for_folder(cfg, folder, out)
            meta = {**partition_meta(cfg, fp, {}), "graph": described}
            report = write_run_dir(cfg, out, None, described, parts, None, meta, own, module, folder=folder,
                                   check_report=lambda rep: preflight_memory(cfg, described, rep,
                                                                             own=module is not None))
        else:
            parts, report = partition_for_run(cfg, data, fp)
            preflight_memory(cfg, described, report, own=module is not None, data=data, parts=parts)
            meta = partition_meta(cfg, fp, report, data) if parts is not None else None
            write_run_dir(cfg, out, data, described, parts, report, meta, own, module)
        part_dir = cfg.partition.dir or str(out / "partitions")
        attempt = 0
    del data, parts
    packed = carry_model(module, P)  # to this launch's own ranks only; the run folder holds no pickle
    args = (cfg, str(out), part_dir, fp, report, resume, attempt, packed)
    run_local_ranks(_local_rank, args, out=out, parts=P, runtime=rt, port=port, cuda=cuda, resume=resume,
                    attempt=attempt)
    return read_json(out / "summary.json")


def prepare_local_ranks(rt: RuntimeConfig, parts: int) -> tuple[int, bool | None]:
    """Before anything is written: refuse more ranks than cores (unless forced), pick or
    check the rendezvous port and start the fork server. Returns ``(port, cuda)`` for
    :func:`run_local_ranks` (``cuda`` None: whether there is a GPU here)."""
    check_rank_count(parts, force=rt.force)
    port = rt.port  # the config keeps the user's value (0 = pick), so it can be rerun
    cuda = None if rt.device == "auto" else rt.device == "cuda"
    if parts > 1:
        if port:
            check_port_free(rt.master_addr, port)
        else:
            port = free_port(rt.master_addr)
        prestart(cuda=torch.cuda.is_available() if cuda is None else cuda)
    return port, cuda


def run_local_ranks(fn: Callable[..., Any], args: tuple, *, out: Path, parts: int, runtime: RuntimeConfig,
                    port: int, cuda: bool | None, resume: bool, attempt: int) -> None:
    """Run ``fn(LaunchInfo, *args)`` on ``parts`` local ranks (in this process when 1; each
    rank's standard error in ``out/logs``) and record the outcome in ``out``'s
    ``status.json``: ``complete``; ``failed`` with the one-line error; ``interrupted`` with
    the signal. Bad input found late (a :class:`~commgnn.errors.UserError`) removes a new
    run's folder, so that it leaves nothing behind; a resumed run keeps its folder."""
    try:
        if parts == 1:
            fn(LaunchInfo(rank=0, world_size=1, local_rank=0, local_world_size=1,
                          master_addr=runtime.master_addr, port=0), *args)
        else:
            spawn_ranks(fn, args, nprocs=parts, master_addr=runtime.master_addr, port=port,
                        log_dir=str(out / "logs"), heartbeat_s=runtime.heartbeat_timeout_s, cuda=cuda)
    except UserError as exc:
        if resume:
            mark_ended(out, "failed", error=str(exc), attempt=attempt)
        else:
            shutil.rmtree(out, ignore_errors=True)  # bad input found late: leave nothing behind
        raise
    except KeyboardInterrupt as exc:
        mark_ended(out, "interrupted", signal=getattr(exc, "signal_name", "SIGINT"), attempt=attempt)
        raise
    except BaseException as exc:
        mark_ended(out, "failed", error=first_line(exc), attempt=attempt)
        raise
    write_status(out, "complete", attempt=attempt)


def _local_rank(info: LaunchInfo, cfg: RunConfig, out: str, part_dir: str, fp: str,
                report: dict[str, Any], resume: bool, attempt: int, packed: bytes | nn.Module | None) -> None:
    ctx = init_distributed(info, cfg.effective_runtime)
    part = load_partition(part_dir, ctx.rank, expected_fingerprint=fp, expected_parts=ctx.world_size)
    run_rank(ctx, cfg, part, Path(out), report, fingerprint=fp, resume=resume, attempt=attempt,
             module=unpack_model(packed))
    shutdown(ctx)  # only after success: after an error a barrier would wait on a dead peer
