"""``commgnn train``: prepare a run, start the ranks, record what they did.

Two launch paths share one per-rank loop (:func:`run_rank`):

* **local** (``--parts P``, no torchrun variables): this process loads and validates the
  graph, partitions it, writes the run directory (with ``partitions/``) and only then
  spawns P ranks, each loading its own partition file. Bad input fails before anything
  is written. With a ``--partition-dir`` whose ``meta.json`` records the run's ``[data]``
  table, the graph is not loaded at all (the files carry their checksums; a directory
  made from other data settings is checked against the loaded graph's fingerprint).
* **torchrun** (``RANK``/``WORLD_SIZE`` set): rank 0 alone loads and partitions the graph
  and sends every rank its partition (or each rank loads its own file of
  ``--partition-dir``, without loading the graph); no rank but 0 ever holds the whole
  graph, and rank 0 drops it before training. Rank 0 writes the run directory. Ranks agree
  that preparation succeeded before training starts.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from commgnn.runner.config import RunConfig, config_from_partition_dir
from commgnn.config import dump_toml, to_dict
from commgnn.data import GIVEN_GRAPH, fingerprint, load_dataset
from commgnn.distributed.context import (DistContext, LaunchInfo, check_port_free, free_port, init_distributed,
                                  launch_info_from_env, shutdown)
from commgnn.runner.preflight import (check_disk, check_memory, check_rank_count, estimate_for_config,
                                      estimate_run_bytes)
from commgnn.runner.own_model import (check_own_model, pack_model, read_own_model, unpack_model,
                                   write_own_model)
from commgnn.runner.rank import run_rank
from commgnn.trainers import checkpoint
from commgnn.runner.step_probe import probe_graph_from_data, probe_graph_from_dir
from commgnn.distributed.forkserver import prestart
from commgnn.distributed.spawn import first_line, is_collective_failure, rank_failure, spawn_ranks
from commgnn.errors import PartitionError, RankFailure, UserError
from commgnn.partition import (LocalPartition, build_local_partition, build_local_partitions, load_meta,
                               load_partition, partition_from_bytes, partition_graph, partition_report,
                               partition_to_bytes, save_partitions)
from commgnn.partition.placement import place_partitions
from commgnn.report import (commit_out_dir, git_commit, host_info, library_versions, prepare_out_dir,
                            read_json, write_json, write_status)
from commgnn.report.records import STATUS


def default_out_dir(cfg: RunConfig) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = Path(cfg.data.dataset).stem if cfg.data.dataset.endswith(".pt") else cfg.data.dataset
    return Path("runs") / f"{stamp}-{name}-{cfg.model.name}-p{cfg.runtime.parts}"


def describe_graph(cfg: RunConfig, data: Any, fp: str) -> dict[str, Any]:
    """The manifest's ``dataset`` entry for a loaded graph."""
    return {"name": getattr(data, "name", cfg.data.dataset), "fingerprint": fp,
            "num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.shape[1]),
            "num_features": int(data.x.shape[1]), "num_classes": int(data.num_classes_total),
            **getattr(data, "graph_notes", {})}


def _recorded_graph(cfg: RunConfig, graph: Any) -> tuple[str, dict[str, Any]] | None:
    """``(fingerprint, description)`` from ``partition.dir``'s ``meta.json`` when it records
    this run's ``[data]`` table (so the graph need not be loaded to check it); None when there
    is no directory, it predates the record, the data settings differ, or a graph was given
    in Python."""
    if not cfg.partition.dir or graph is not None:
        return None
    meta = load_meta(cfg.partition.dir)
    if meta.get("data") != _data_table(cfg):
        return None
    return meta["graph_fingerprint"], _describe_from_meta(meta)


def _describe_from_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``dataset`` entry from a partition directory's ``meta.json`` (the graph
    itself is not loaded)."""
    if isinstance(meta.get("graph"), dict):
        return dict(meta["graph"])
    return {"name": meta.get("dataset"), "fingerprint": meta["graph_fingerprint"],
            **{k: meta[k] for k in ("num_nodes", "num_edges", "num_features", "num_classes") if k in meta}}


def _manifest(cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any], torchrun: bool) -> dict[str, Any]:
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


def _data_table(cfg: RunConfig) -> Any:
    """What identifies the run's graph in a partition directory's ``meta.json``: the
    ``[data]`` table as JSON reads it back, less the folders it is read and cached from
    (the same named dataset wherever it lies), and for a user's ``.pt`` file its resolved
    path, size and modification time (a file rewritten in place is another graph)."""
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
    return table


def partition_meta(cfg: RunConfig, fp: str, report: dict[str, Any], data: Any = None) -> dict[str, Any]:
    """``meta.json`` content of a partition directory made for this run (``data``: the
    graph, whose manifest description it records)."""
    described = {"graph": describe_graph(cfg, data, fp)} if data is not None else {}
    return {"graph_fingerprint": fp, "dataset": cfg.data.dataset, "data": _data_table(cfg), **described,
            "method": cfg.partition.method,
            "objective": cfg.partition.objective, "seed": cfg.partition.seed, "hosts": cfg.partition.hosts,
            "report": report}


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
    placement = None
    if cfg.partition.hosts > 1:
        if P % cfg.partition.hosts:
            raise PartitionError(f"partition.hosts = {cfg.partition.hosts} does not divide {P} ranks evenly")
        parts, placement = place_partitions(data.edge_index, parts, P, cfg.partition.hosts)
    report = partition_report(data.edge_index, parts, P, data.train_mask).to_dict()
    if placement is not None:
        report["placement"] = placement
    return parts, report


def _write_header(staging: Path, cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any],
                  torchrun: bool) -> None:
    (staging / "config.toml").write_text(dump_toml(to_dict(cfg)))
    write_json(staging / "manifest.json", _manifest(cfg, graph, report, torchrun))


def _preflight_memory(cfg: RunConfig, graph: dict[str, Any], report: dict[str, Any], *, own: bool,
                      data: Any = None, parts: torch.Tensor | None = None) -> None:
    """Refuse a job whose estimate exceeds the memory cap. A neighbour-sampling or VR-GCN
    run that the overlap-free bound refuses is estimated again from a sampled probe of its
    steps (:mod:`~commgnn.runner.step_probe`): the bound counts every sampled neighbour as
    new and refuses runs that fit several times over, and the probe costs a CSR of the
    graph, so it runs only when the bound says no."""
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


def _write_run_dir(cfg: RunConfig, out: Path, data: Any, graph: dict[str, Any], fp: str,
                   parts: torch.Tensor | None, report: dict[str, Any]) -> None:
    """Write the run directory through a hidden staging sibling (nothing half-written).
    ``data`` (the loaded graph) is needed only when ``parts`` are to be saved."""
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
        _write_header(staging, cfg, graph, report, torchrun=False)
        if parts is not None:
            save_partitions(staging / "partitions", build_local_partitions(data, parts, P),
                            partition_meta(cfg, fp, report, data))
        commit_out_dir(staging, out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"cannot write the run directory {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def train_local(cfg: RunConfig, *, resume: bool = False, graph: Any = None,
                module: nn.Module | None = None) -> dict[str, Any]:
    """Run P local ranks; return the summary. With ``resume``, ``cfg.output.out`` is an
    existing run directory to continue from its newest checkpoint. ``graph``: a graph given
    in Python (PyG ``Data``, dict or ``InMemoryDataset``) instead of ``cfg.data.dataset``."""
    cfg = config_from_partition_dir(cfg)
    P, rt = cfg.runtime.parts, cfg.effective_runtime
    if module is not None:
        check_own_model(module, cfg)
    check_rank_count(P, force=rt.force)
    port = rt.port  # the config keeps the user's value (0 = pick), so it can be rerun
    cuda = None if rt.device == "auto" else rt.device == "cuda"
    if P > 1:
        if port:
            check_port_free(rt.master_addr, port)
        else:
            port = free_port(rt.master_addr)
        prestart(cuda=torch.cuda.is_available() if cuda is None else cuda)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    if resume and graph is None and read_json(out / "manifest.json")["dataset"]["name"] == GIVEN_GRAPH:
        raise UserError(f"{out} trained on a graph given in Python; resume it from Python with "
                        f"commgnn.resume({str(out)!r}, data)")
    recorded = _recorded_graph(cfg, graph)
    if recorded is not None:  # a partition directory made for this [data]: the graph is not needed
        data, (fp, described) = None, recorded
    else:
        data = load_dataset(cfg.data, graph)
        fp = fingerprint(data)
        described = describe_graph(cfg, data, fp)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    if resume:
        parts, report = None, read_json(out / "manifest.json")["partition"]["report"]
        part_dir = cfg.partition.dir or str(out / "partitions")
        for r in range(P):
            load_partition(part_dir, r, expected_fingerprint=fp, expected_parts=P)
        checkpoint.verify(out, P)  # every rank's file against its sha256, before any rank starts
        attempt = _previous_attempt(out) + 1
        module = read_own_model(out) if module is None else module
        _ended(out, "running", resumed=True, attempt=attempt)
    else:
        parts, report = partition_for_run(cfg, data, fp)
        _preflight_memory(cfg, described, report, own=module is not None, data=data, parts=parts)
        _write_run_dir(cfg, out, data, described, fp, parts, report)
        part_dir = cfg.partition.dir or str(out / "partitions")
        attempt = 0
        if module is not None:
            write_own_model(out, module)
    del data, parts
    packed = pack_model(module)
    args = (cfg, str(out), part_dir, fp, report, resume, attempt, packed)
    try:
        if P == 1:
            _local_rank(LaunchInfo(rank=0, world_size=1, local_rank=0, local_world_size=1,
                                   master_addr=rt.master_addr, port=0), *args)
        else:
            spawn_ranks(_local_rank, args, nprocs=P, master_addr=rt.master_addr, port=port,
                        log_dir=str(out / "logs"), heartbeat_s=rt.heartbeat_timeout_s,
                        cuda=cuda)
    except UserError as exc:
        if resume:
            _ended(out, "failed", error=str(exc), attempt=attempt)
        else:
            shutil.rmtree(out, ignore_errors=True)  # bad input found late: leave nothing behind
        raise
    except KeyboardInterrupt as exc:
        _ended(out, "interrupted", signal=getattr(exc, "signal_name", "SIGINT"), attempt=attempt)
        raise
    except BaseException as exc:
        _ended(out, "failed", error=first_line(exc), attempt=attempt)
        raise
    write_status(out, "complete", attempt=attempt)
    return read_json(out / "summary.json")


def _ended(out: Path, state: str, **extra: Any) -> None:
    """Record ``state`` for a run that is not (or no longer) finished: ``summary.json``
    exists only for finished runs."""
    if out.is_dir():
        (out / "summary.json").unlink(missing_ok=True)
    write_status(out, state, **extra)


def _previous_attempt(out: Path) -> int:
    """The attempt number recorded in ``status.json`` (0 for a run never resumed)."""
    try:
        return int(read_json(out / STATUS).get("attempt", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _local_rank(info: LaunchInfo, cfg: RunConfig, out: str, part_dir: str, fp: str,
                report: dict[str, Any], resume: bool, attempt: int, packed: bytes | None) -> None:
    ctx = init_distributed(info, cfg.effective_runtime)
    part = load_partition(part_dir, ctx.rank, expected_fingerprint=fp, expected_parts=ctx.world_size)
    run_rank(ctx, cfg, part, Path(out), report, fingerprint=fp, resume=resume, attempt=attempt,
             module=unpack_model(packed))
    shutdown(ctx)  # only after success: after an error a barrier would wait on a dead peer


def _agree(ctx: DistContext, ok: bool, *checks: str) -> bool:
    """True when every rank succeeded and all ranks hold the same ``checks`` strings
    (fingerprints of the graph and the partition: ranks that partitioned on their own
    must have got the same answer, or the exchange splits would not line up)."""
    digest = int(hashlib.sha256("|".join(checks).encode()).hexdigest()[:12], 16) if ok else -1
    lo = ctx.all_reduce(torch.tensor([float(digest)], dtype=torch.float64), "min")
    hi = ctx.all_reduce(torch.tensor([float(digest)], dtype=torch.float64), "max")
    return bool(lo[0] == hi[0]) and digest >= 0


def _prepare_torchrun(cfg: RunConfig, ctx: DistContext, graph: Any) -> tuple[dict[str, Any], str, LocalPartition,
                                                                             dict[str, Any]]:
    """This rank's partition, without any rank holding the whole graph afterwards.
    Returns ``(graph description, fingerprint, partition, report)``.

    * ``--partition-dir``: every rank loads its own file. The graph is not loaded at all
      when the directory's ``meta.json`` records this run's ``[data]`` table; otherwise
      (an older directory, other data settings, or a graph given in Python) every rank
      loads it to check its fingerprint against the directory's, as before.
    * otherwise rank 0 alone loads and partitions the graph, and sends each rank its
      partition point to point; the others wait for it (:meth:`Watchdog.wait_key`, which
      names rank 0 if it stops, and does not time out while it works), so no rank but 0
      ever holds the graph, and rank 0 drops it before training.
    """
    if cfg.partition.dir:
        return _prepare_from_dir(cfg, ctx, graph)
    if not ctx.is_distributed or ctx.watchdog is None:
        data = load_dataset(cfg.data, graph)
        fp = fingerprint(data)
        parts, report = partition_for_run(cfg, data, fp)
        return describe_graph(cfg, data, fp), fp, build_local_partition(data, parts, 1, 0), report
    P, wd = ctx.world_size, ctx.watchdog
    if not ctx.is_main:
        # Loading and METIS can take long, and pymetis holds the GIL (rank 0's heartbeat
        # stops meanwhile): an hour of silence, or the time-out if longer, before rank 0 is
        # declared stopped. The hand-off itself is judged by the time-out.
        msg = _handoff(wd.wait_key("prepared", 0, silent_s=max(ctx.timeout_s, PREPARE_SILENCE_S)))
        _handoff(wd.wait_key(f"part/{ctx.rank}", 0, silent_s=ctx.timeout_s))
        part = partition_from_bytes(ctx.recv_bytes(0), rank=ctx.rank, num_parts=P, num_nodes=msg["num_nodes"])
        _handoff(wd.wait_key("sent", 0, silent_s=ctx.timeout_s))  # not a collective: rank 0 may still be sending
        return {}, msg["fingerprint"], part, msg["report"]
    published = False
    try:
        data = load_dataset(cfg.data, graph)
        fp = fingerprint(data)
        parts, report = partition_for_run(cfg, data, fp)
        wd.publish("prepared", json.dumps({"fingerprint": fp, "report": report, "num_nodes": int(data.num_nodes)}))
        published = True
        for r in range(1, P):  # one partition in memory at a time beside the graph
            blob = partition_to_bytes(build_local_partition(data, parts, P, r))
            wd.publish(f"part/{r}", json.dumps({"send": True}))  # rank r posts its receive only now
            ctx.send_bytes(blob, r)
            del blob
        own = build_local_partition(data, parts, P, 0)
    except Exception as exc:  # the others wait for these keys: tell them, then fail here
        user = isinstance(exc, UserError)
        failed = json.dumps({"error": str(exc) if user else f"rank 0: {first_line(exc)}", "user": user})
        keys = ([] if published else ["prepared"]) + [f"part/{r}" for r in range(1, P)] + ["sent"]
        for key in keys:  # a rank already receiving sees its receive fail instead
            wd.publish(key, failed)
        raise
    wd.publish("sent", json.dumps({"sent": True}))
    return describe_graph(cfg, data, fp), fp, own, report


PREPARE_SILENCE_S = 3600.0
"""How long rank 0 may show no heartbeat while it loads and partitions the graph under
torchrun (pymetis holds the GIL) before the waiting ranks declare it stopped."""


def _handoff(raw: str) -> dict[str, Any]:
    """A key rank 0 published for the hand-off; its error, raised here, when it failed."""
    msg = json.loads(raw)
    if "error" in msg:
        raise (UserError if msg["user"] else RankFailure)(msg["error"])
    return msg


def _prepare_from_dir(cfg: RunConfig, ctx: DistContext, graph: Any) -> tuple[dict[str, Any], str,
                                                                              LocalPartition, dict[str, Any]]:
    """:func:`_prepare_torchrun` from ``--partition-dir``; ranks agree that every one of
    them loaded its file (and, where the graph was loaded, that it is the directory's)."""
    error: BaseException | None = None
    described, fp, part, report, checks = {}, "", None, {}, ()
    try:
        report = load_meta(cfg.partition.dir).get("report", {})
        recorded = _recorded_graph(cfg, graph)
        if recorded is not None:
            fp, described = recorded
        else:
            data = load_dataset(cfg.data, graph)
            fp = fingerprint(data)
            described = describe_graph(cfg, data, fp)
            del data
        part = load_partition(cfg.partition.dir, ctx.rank, expected_fingerprint=fp, expected_parts=ctx.world_size)
        checks = (fp,)
    except Exception as exc:  # every rank must reach the agreement below
        error = exc
    if not _agree(ctx, error is None, *checks):
        if error is not None:
            raise error
        raise UserError("ranks disagree on the graph or its partition (different data or "
                        "library versions on different hosts?); pass a shared --partition-dir")
    return described, fp, part, report  # type: ignore[return-value]


def train_torchrun(cfg: RunConfig, info: LaunchInfo, graph: Any = None,
                   module: nn.Module | None = None) -> dict[str, Any] | None:
    """This process is one rank of a torchrun job; rank 0 returns the summary.

    The world size comes from torchrun; ``runtime.parts`` is replaced by it. After an
    elastic restart (``torchrun --max-restarts N``) the run continues in the same
    directory from its newest checkpoint (``runtime.checkpoint_every``).
    """
    cfg = config_from_partition_dir(replace(cfg, runtime=replace(cfg.runtime, parts=info.world_size)))
    if module is not None:
        check_own_model(module, cfg)
        module = unpack_model(pack_model(module))  # a copy: the caller's module stays untrained
    ctx = init_distributed(info, cfg.effective_runtime)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    resume = info.restart_count > 0 and (out / "config.toml").is_file()
    described, fp, part, report = _prepare_torchrun(cfg, ctx, graph)
    error: BaseException | None = None
    staging = None
    if ctx.is_main and not resume:
        try:
            staging = prepare_out_dir(out)
            _write_header(staging, cfg, described, report, torchrun=True)
            commit_out_dir(staging, out)
            if module is not None:
                write_own_model(out, module)
        except Exception as exc:
            error = exc
    elif ctx.is_main:
        _ended(out, "running", resumed=True, attempt=info.restart_count)
    if not _agree(ctx, error is None):
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if error is not None:
            raise error
        raise UserError("rank 0 could not write the run directory")
    if ctx.watchdog is not None and ctx.is_main:
        ctx.watchdog.on_sigterm = lambda: _ended(out, "interrupted", signal="SIGTERM")
    try:
        run_rank(ctx, cfg, part, out, report, fingerprint=fp, resume=resume, attempt=info.restart_count,
                 module=module)
    except BaseException as exc:
        raise _rank_failure(ctx, exc, out) from None
    if ctx.is_main:
        write_status(out, "complete")
    shutdown(ctx)
    return read_json(out / "summary.json") if ctx.is_main else None


def _rank_failure(ctx: DistContext, exc: BaseException, out: Path) -> BaseException:
    """Under torchrun: :func:`commgnn.distributed.spawn.rank_failure` (the traceback into this
    rank's log in the run directory), and rank 0 marks the run failed."""
    failure = rank_failure(ctx, exc, out / "logs" / f"rank{ctx.rank}.log")
    if ctx.is_main and not is_collective_failure(exc) and not isinstance(exc, KeyboardInterrupt):
        user = isinstance(exc, UserError)
        _ended(out, "failed", error=str(exc) if user else f"rank {ctx.rank}: {first_line(exc)}")
    return failure


def train_command(cfg: RunConfig, env: Mapping[str, str], *, resume: bool = False,
                  graph: Any = None, module: nn.Module | None = None) -> dict[str, Any] | None:
    """Train as ``cfg`` says: under torchrun when its variables are in ``env``, else with
    local ranks. Rank 0 (and the local launcher) returns the summary, other ranks None."""
    if env.get("COMMGNN_ENERGY") == "0":  # e.g. CI: skip CodeCarbon's per-rank start-up
        cfg = replace(cfg, energy=replace(cfg.energy, track=False))
    info = launch_info_from_env(env)
    if info is not None:
        return train_torchrun(cfg, info, graph, module)
    return train_local(cfg, resume=resume, graph=graph, module=module)
