"""``commgnn federate`` on the shared runner: the run folder, ``status.json``, the manifest,
the logs, the pre-flight, the launch, the fault handling and the checkpoints are those of
``commgnn train`` (the same functions of :mod:`~commgnn.runner.run_dir`,
:mod:`~commgnn.runner.local`, :mod:`~commgnn.runner.preflight` and
:mod:`commgnn.trainers.checkpoint`); only the rank's work is a federation's
(:class:`~commgnn.federated.engine.Federation`).

A federated run folder holds ``config.toml``, ``manifest.json`` (``"command": "federate"``),
``status.json``, ``logs/`` (one log per spawned rank), ``metrics.jsonl`` (one row per
evaluation, written as the run goes), and when it finished ``summary.json`` and
``fairness.md``; with ``runtime.checkpoint_every = k`` also ``checkpoints/`` (every rank's
state after every k-th round; the layout of :mod:`commgnn.trainers.checkpoint`, its
``epoch`` a round). Bad input found before the first round (a policy that forbids the plan,
a threshold the clients cannot meet) leaves nothing behind; a run that fails later keeps
its folder with ``status.json`` saying why.

Resume (``commgnn federate --resume RUN_DIR``, :func:`commgnn.resume`): every rank loads
its state from the newest complete checkpoint (tensors and plain values only, read with
``torch.load(..., weights_only=True)``), rank 0 rewrites ``metrics.jsonl`` with the rows up
to it, and the rounds after it are those of the uninterrupted run: the same rows (but
their ``wall_s``) and the same final accuracies.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from commgnn.config import load_toml, replace_path
from commgnn.data import fingerprint, load_dataset
from commgnn.distributed.context import (DistContext, LaunchInfo, init_distributed, launch_info_from_env, shutdown,
                                         threads_per_rank)
from commgnn.distributed.spawn import rank_failure
from commgnn.errors import UserError
from commgnn.federated.config import FederateConfig
from commgnn.federated.engine import Federation
from commgnn.federated.fairness import fairness_markdown
from commgnn.federated.transport import Transport
from commgnn.report import read_json, write_json, write_status
from commgnn.report.records import MetricsLog, dumps_standard
from commgnn.runner.local import prepare_local_ranks, run_local_ranks
from commgnn.runner.preflight import check_disk, estimate_run_bytes
from commgnn.runner.run_dir import (GIVEN_PREFIX, base_manifest, config_text, describe_graph, given_graph_name,
                                    graph_label, launch_entry, mark_ended, previous_attempt, rerun_entry,
                                    rerun_notes, time_stamp, write_staged)
from commgnn.trainers import checkpoint

COMMAND = "federate"
"""``manifest.json``'s ``command`` of a federated run folder."""

MB = 1e6


# ------------------------------------------------------------------ before anything is loaded
def default_out_dir(cfg: FederateConfig, *, graph: Any = None) -> Path:
    """``runs/federate-<dataset>-<algorithm>-<time>`` (``python`` for a graph given in Python)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", graph_label(cfg, graph)).strip("._") or "graph"
    return Path("runs") / f"federate-{name}-{cfg.federated.algorithm}-{time_stamp()}"


def preflight(cfg: FederateConfig, n_clients: int | None) -> None:
    """Refuse, before any data is loaded or round run, a plan that the policy forbids or a
    secure-aggregation threshold the clients cannot meet (``n_clients`` None: not known yet)."""
    if cfg.policy.path:
        from commgnn.federated.policy import load_policy

        policy = load_policy(cfg.policy.path)
        if n_clients is not None:
            policy.validate_for(n_clients)
        fed = cfg.federated
        policy.check_plan(secure_agg=cfg.secagg.enabled, embeddings_cross=fed.cross_edges == "embeddings",
                          embedding_bits=fed.embedding_bits, embedding_noise=fed.embedding_noise,
                          aggregator=fed.aggregator)
    if cfg.secagg.enabled and n_clients is not None and cfg.federated.algorithm in ("fedavg", "fedprox"):
        k = max(1, round(cfg.federated.participation * n_clients))  # clients drawn per round, as the engine draws
        cfg.secagg.threshold_count(k)
        if cfg.uplink.codec == "fp32":  # the fixed-point ring must hold k clients' sum
            cfg.secagg.check_clients(k)


def is_federated_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a ``commgnn federate`` run (its manifest says so, or, for a
    folder written before federated runs had one, its ``config.toml`` has a ``[federated]``
    table)."""
    run_dir = Path(run_dir)
    try:
        if (run_dir / "manifest.json").is_file():
            return read_json(run_dir / "manifest.json").get("command") == COMMAND
        return (run_dir / "config.toml").is_file() and "federated" in load_toml(run_dir / "config.toml")
    except (OSError, ValueError, AttributeError):
        return False


def given_graph(cfg: FederateConfig, graph: Any, out: Path, resume: bool) -> tuple[FederateConfig, Any]:
    """A graph given in Python, loaded (a dict or dataset becomes a PyG ``Data``) and recorded
    as ``data.dataset = "python:<fingerprint>"`` (what ran; it cannot be loaded by name);
    ``(cfg, graph)`` unchanged without one. A run folder recording one needs it again."""
    if graph is None:
        if cfg.data.dataset.startswith(GIVEN_PREFIX):
            raise UserError(f"{out} trained on a graph given in Python; resume it from Python with "
                            f"commgnn.resume({str(out)!r}, data)" if resume else
                            f"data.dataset = {cfg.data.dataset!r} names a graph given in Python to another run; "
                            f"pass the graph: commgnn.federate(data, config=...)")
        return cfg, None
    data = load_dataset(cfg.data, graph)
    name = given_graph_name(fingerprint(data))
    if resume and cfg.data.dataset != name:
        raise UserError(f"{out} trained on another graph ({cfg.data.dataset}) than the one given ({name})")
    return replace_path(cfg, "data.dataset", name), data


# ------------------------------------------------------------------ the run folder
def _manifest(cfg: FederateConfig, graph: dict[str, Any], torchrun: bool) -> dict[str, Any]:
    """``manifest.json`` of a federated run: the entries every run folder has
    (:func:`~commgnn.runner.run_dir.base_manifest`), ``rerun`` as ``commgnn train`` writes it,
    and the federation's seed and split."""
    return {"command": COMMAND, **base_manifest(), "seed": cfg.federated.seed, "dataset": graph,
            "rerun": rerun_entry(rerun_notes(cfg)),
            "split": {"method": cfg.split.method, "clients": cfg.split.clients, "seed": cfg.split.seed},
            "launch": launch_entry(cfg, torchrun)}


def _describe(cfg: FederateConfig, graph: Any) -> dict[str, Any]:
    """The manifest's ``dataset`` entry (as ``commgnn train`` writes it)."""
    return describe_graph(cfg, graph, fingerprint(graph))  # type: ignore[arg-type]  # it reads cfg.data alone


def _write_run_dir(cfg: FederateConfig, out: Path, graph: dict[str, Any], torchrun: bool) -> None:
    """The run folder's header (``config.toml``, ``manifest.json``) through a hidden staging
    sibling, then ``logs/`` and ``status.json`` (running); refused in one line when the disk
    is too small or the folder cannot be written."""
    params = (graph.get("num_features", 0) + 1) * cfg.federated.hidden + (cfg.federated.hidden + 1) * \
        graph.get("num_classes", 0)
    check_disk(out, estimate_run_bytes(partition_bytes=0.0, epochs=cfg.federated.rounds, param_count=int(params),
                                       parts=cfg.runtime.parts, checkpoint_every=cfg.runtime.checkpoint_every))

    def write(staging: Path) -> None:
        (staging / "config.toml").write_text(config_text(cfg, rerun_notes(cfg)))
        write_json(staging / "manifest.json", _manifest(cfg, graph, torchrun))

    write_staged(out, write)


def _progress(row: dict[str, Any]) -> str:
    text = (f"round {row['round']:>4d}  val {row['val_acc']:.4f}  test {row['test_acc']:.4f}  "
            f"uplink {row['uplink_bytes'] / MB:.3f} MB")
    if "epsilon" in row:
        text += f"  epsilon {row['epsilon']:.3f}"
    return text


def _load_state(out: Path, fed: Federation) -> dict[str, Any] | None:
    """This rank's state from the newest complete checkpoint (None without one), checked
    against the job by :func:`~commgnn.trainers.checkpoint.load_rank` (as many ranks, the same
    split and masks, the file's SHA-256). Tensors and plain values only."""
    meta = checkpoint.latest(out)
    if meta is None:
        return None
    return checkpoint.load_rank(out, meta, fed.t.rank, parts=fed.t.world, fingerprint=fed.split_digest,
                                step_key="round")


def federate_rank(fed: Federation, ctx: DistContext | None, out: Path, *, resume: bool) -> dict[str, Any] | None:
    """One rank's part of a federated run in its folder ``out`` (every rank calls it):
    continue from the newest checkpoint with ``resume``, write ``metrics.jsonl`` (rank 0,
    as the rounds go), checkpoint every ``runtime.checkpoint_every`` rounds, and on rank 0
    write ``summary.json`` and ``fairness.md`` and return the summary (None elsewhere)."""
    cfg = fed.cfg
    state = _load_state(out, fed) if resume else None
    main = fed.t.is_server
    log = None
    if main:
        rows = state["curve"] if state is not None else []
        tmp = out / "metrics.jsonl.tmp"  # the rows up to the checkpoint, exactly once each
        tmp.write_text("".join(dumps_standard(r) + "\n" for r in rows))
        tmp.replace(out / "metrics.jsonl")
        log = MetricsLog(out / "metrics.jsonl")
    quiet = cfg.output.quiet

    def on_eval(row: dict[str, Any]) -> None:
        if not out.is_dir():
            raise UserError(f"run folder {out} was removed during the run")
        assert log is not None
        log.write(row)
        if not quiet:
            print(_progress(row), flush=True)

    def on_checkpoint(r: int, st: dict[str, Any]) -> None:  # every rank saves, then rank 0 commits the set
        sha = checkpoint.save_rank(out, r, fed.t.rank, st)
        # every rank's hash for the set's manifest; the gather is also the barrier that confirms all saved
        hashes = checkpoint.gather_hashes(ctx, sha) if ctx is not None else [sha]
        if main:
            checkpoint.commit(out, r, fed.t.world, fed.split_digest, hashes)

    try:
        summary = fed.run(on_eval if main else None, state=state, on_checkpoint=on_checkpoint,
                          checkpoint_every=cfg.runtime.checkpoint_every)
    finally:
        if log is not None:
            log.close()
    if summary is None:
        return None
    summary = dict(summary)
    summary.pop("curve", None)  # metrics.jsonl holds it
    write_json(out / "summary.json", summary)
    (out / "fairness.md").write_text(fairness_markdown(summary["fairness"]))
    return summary


# ------------------------------------------------------------------ launching
def federate_command(cfg: FederateConfig, env: Mapping[str, str], *, resume: bool = False,
                     graph: Any = None) -> dict[str, Any] | None:
    """Run ``cfg`` under torchrun when its variables are in ``env`` (rank 0 serves), else on
    ``runtime.parts`` local ranks; ``cfg.output.out`` must be set. Rank 0 (and the local
    launcher) returns the summary, other ranks None. ``resume``: continue the run folder
    ``cfg.output.out`` from its newest checkpoint."""
    info = launch_info_from_env(env)
    if info is not None:
        return federate_torchrun(cfg, info, graph)
    return federate_local(cfg, resume=resume, graph=graph)


def federate_local(cfg: FederateConfig, *, resume: bool = False, graph: Any = None) -> dict[str, Any]:
    """Run on ``runtime.parts`` local ranks (1: the server and every client in this process,
    built here, so the split is known to the pre-flight before the folder is written)."""
    assert cfg.output.out is not None
    out, P, rt = Path(cfg.output.out), cfg.runtime.parts, cfg.runtime
    cfg, graph = given_graph(cfg, graph, out, resume)
    preflight(cfg, None if cfg.split.method == "file" else cfg.split.clients)  # before any data is loaded
    port, cuda = prepare_local_ranks(rt, P)
    federation = None
    if P == 1:
        torch.set_num_threads(threads_per_rank(rt, 1))
        federation = Federation(cfg, graph)
        preflight(cfg, int(federation.n_clients))
        data = federation.graph
    else:
        data = load_dataset(cfg.data, graph)  # bad input fails here, before the folder is written
    if resume:
        checkpoint.verify(out, P)  # every rank's file against its sha256, before the run is marked running
        attempt = previous_attempt(out) + 1
        mark_ended(out, "running", resumed=True, attempt=attempt)
    else:
        _write_run_dir(cfg, out, _describe(cfg, data), torchrun=False)
        attempt = 0
    del data
    args = (cfg, str(out), resume, None if P == 1 else graph, federation)
    run_local_ranks(_local_rank, args, out=out, parts=P, runtime=rt, port=port, cuda=cuda, resume=resume,
                    attempt=attempt)
    return read_json(out / "summary.json")


def _local_rank(info: LaunchInfo, cfg: FederateConfig, out: str, resume: bool, graph: Any,
                federation: Federation | None) -> None:
    if federation is not None:  # one process: built by the launcher, no process group
        federate_rank(federation, None, Path(out), resume=resume)
        return
    ctx = init_distributed(info, cfg.runtime)
    federate_rank(Federation(cfg, graph, ctx=ctx), ctx, Path(out), resume=resume)
    shutdown(ctx)  # only after success: after an error a barrier would wait on a dead peer


def federate_torchrun(cfg: FederateConfig, info: LaunchInfo, graph: Any = None) -> dict[str, Any] | None:
    """This process is one rank of a torchrun job (rank 0 serves and writes the folder;
    ``runtime.parts`` becomes torchrun's world size). After an elastic restart the run
    continues from its newest checkpoint. A failure comes back as one line naming the rank
    at fault (:func:`~commgnn.distributed.spawn.rank_failure`), at once; bad input leaves no
    folder behind, another failure marks it failed."""
    cfg = replace_path(cfg, "runtime.parts", info.world_size)
    ctx = init_distributed(info, cfg.runtime)
    # Every rank writes its checkpoints into rank 0's folder (a default name has a time in it).
    out = Path(Transport(ctx, 0).broadcast(cfg.output.out or str(default_out_dir(cfg, graph=graph))))
    cfg = replace_path(cfg, "output.out", str(out))
    resume = info.restart_count > 0 and (out / "config.toml").is_file()
    written = False
    try:
        cfg, graph = given_graph(cfg, graph, out, resume)
        fed = Federation(cfg, graph, ctx=ctx)
        error = None
        if resume:  # each rank checks its own file (a host may see no other's), before the run is marked running
            try:
                checkpoint.verify(out, fed.t.world, ranks=[ctx.rank])
            except UserError as exc:
                error = str(exc)
            errors = fed.t.gather(error)
            error = next((e for e in errors or [] if e is not None), None)
        if ctx.is_main and error is None:
            try:
                if resume:
                    mark_ended(out, "running", resumed=True, attempt=info.restart_count)
                else:
                    preflight(cfg, int(fed.n_clients))
                    _write_run_dir(cfg, out, _describe(cfg, fed.graph), torchrun=True)
                    written = True
            except UserError as exc:
                error = str(exc)
        error = fed.t.broadcast(error)
        if error is not None:
            raise UserError(error)
        if ctx.watchdog is not None and ctx.is_main:
            ctx.watchdog.on_sigterm = lambda: mark_ended(out, "interrupted", signal="SIGTERM")
        summary = federate_rank(fed, ctx, out, resume=resume)
    except BaseException as exc:
        failure = rank_failure(ctx, exc, out / "logs" / f"rank{ctx.rank}.log" if (out / "logs").is_dir() else None)
        if ctx.is_main and (written or resume) and not isinstance(exc, KeyboardInterrupt):
            if isinstance(failure, UserError) and not resume:
                shutil.rmtree(out, ignore_errors=True)  # bad input found late: leave nothing behind
            else:
                mark_ended(out, "failed", error=str(failure))
        raise failure from None
    if ctx.is_main:
        write_status(out, "complete", attempt=info.restart_count)
    shutdown(ctx)
    return summary if ctx.is_main else None
