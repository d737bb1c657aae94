"""Ranks started by ``torchrun`` (``RANK``/``WORLD_SIZE`` set): rank 0 alone loads and
partitions the graph and hands every rank its partition (or each rank loads its own file of
``--partition-dir``, without loading the graph); no rank but 0 ever holds the whole graph,
and rank 0 drops it before training. Rank 0 writes the run directory. Ranks agree that
preparation succeeded before training starts.

``status.json`` under torchrun (no commgnn launcher watches the ranks, so the ranks
themselves record how the job ended, :class:`_Ending`):

* ``complete``: rank 0, after the summary.
* ``failed``, a rank's own error: the first rank to record it (``rank R of P failed: ...``;
  a bad input: its one line).
* ``failed``, a rank that died without a word (SIGKILL, the OOM killer, a crash): the
  first surviving rank that sees it, on its collective's failure, its heartbeat watch or
  the SIGTERM torchrun's agent then sends: ``rank R of P died (killed by SIGKILL)`` (how,
  where the dead process can still be read; it must be on the same host). Rank 0's death
  included: another rank writes it.
* ``interrupted`` (``signal: SIGTERM``): rank 0, when the agent (or whoever) stops the
  workers and no rank died before.
* ``failed``, the agent died (SIGKILL): rank 0, which the kernel then sends SIGTERM
  (``the torchrun agent (pid N) died``).

Every rank records ``pid/<rank>`` (host and pid) and ``end/<rank>`` (how it ends
knowingly) in the job's store; the first rank to claim ``ended`` writes ``status.json``,
and only where the run folder is (its host). A rank that cannot see the folder writes
nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from commgnn.data import fingerprint, load_dataset
from commgnn.distributed.context import DistContext, LaunchInfo, init_distributed, shutdown
from commgnn.distributed.spawn import first_line, is_collective_failure, rank_failure
from commgnn.distributed.watchdog import Failure, process_end, read_failure
from commgnn.errors import RankFailure, UserError
from commgnn.partition import (LocalPartition, build_local_partition, load_meta, load_partition,
                               partition_from_bytes, partition_to_bytes)
from commgnn.report import commit_out_dir, prepare_out_dir, read_json, write_status
from commgnn.runner.config import RunConfig, config_from_partition_dir
from commgnn.runner.own_model import check_own_model, describe_own_model, write_own_model
from commgnn.runner.prepare import partition_for_run, recorded_graph
from commgnn.runner.rank import run_rank
from commgnn.runner.run_dir import (default_out_dir, describe_graph, mark_ended, record_given_graph, warn_cut_record,
                                    write_header)


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
        recorded = recorded_graph(cfg, graph)
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
        module = copy.deepcopy(module)  # a copy: the caller's module stays untrained
    ctx = init_distributed(info, cfg.effective_runtime)
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg, graph=graph, module=module)
    cfg = replace(cfg, output=replace(cfg.output, out=str(out)))
    resume = info.restart_count > 0 and (out / "config.toml").is_file()
    if ctx.watchdog is not None:  # for a peer that finds this rank dead (see _Ending)
        ctx.watchdog.publish(f"pid/{ctx.rank}", f"{socket.gethostname()}:{os.getpid()}")
    ending = _Ending(ctx, out, info.restart_count)
    described, fp, part, report = _prepare_torchrun(cfg, ctx, graph)
    if graph is not None:  # what ran is recorded (every rank holds the fingerprint)
        cfg = record_given_graph(cfg, fp)
    error: BaseException | None = None
    staging = None
    if ctx.is_main and not resume:
        try:
            own = describe_own_model(module) if module is not None else None
            staging = prepare_out_dir(out)
            write_header(staging, cfg, described, report, torchrun=True, own=own)
            if module is not None:  # in the folder before it appears, as for local ranks
                write_own_model(staging, module, own)
            commit_out_dir(staging, out)
        except Exception as exc:
            error = exc
    elif ctx.is_main:
        warn_cut_record(out)
        mark_ended(out, "running", resumed=True, attempt=info.restart_count)
    if not _agree(ctx, error is None):
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if error is not None:
            raise error
        raise UserError("rank 0 could not write the run directory")
    ending.owns = True  # the folder is this run's now: its final state may be written
    try:
        run_rank(ctx, cfg, part, out, report, fingerprint=fp, resume=resume, attempt=info.restart_count,
                 module=module)
    except BaseException as exc:
        raise _rank_failure(ctx, exc, out, ending) from None
    if ctx.watchdog is not None:
        ctx.watchdog.mark_end("complete")
    if ctx.is_main:
        write_status(out, "complete", **ending.extra)
    shutdown(ctx)
    return read_json(out / "summary.json") if ctx.is_main else None


def _rank_failure(ctx: DistContext, exc: BaseException, out: Path, ending: "_Ending") -> BaseException:
    """Under torchrun: :func:`commgnn.distributed.spawn.rank_failure` (the traceback into this
    rank's log in the run directory), and the run is marked failed (:class:`_Ending`)."""
    failure = rank_failure(ctx, exc, out / "logs" / f"rank{ctx.rank}.log")
    if isinstance(exc, KeyboardInterrupt):
        return failure
    if is_collective_failure(exc):
        dead = ending.dead_peer()
        if dead is not None:
            ending.failed(dead)
        elif ending.signalled():  # a peer was stopped by SIGTERM: the job is being stopped
            ending.stopped()
        else:
            ending.failed(first_line(failure))
    else:
        ending.failed(str(exc) if isinstance(exc, UserError) else first_line(failure))
    return failure


class _Ending:
    """Who writes ``status.json`` under torchrun, and what (the module docstring's list).
    Installed on this rank's watchdog, whose thread calls it on SIGTERM, on a peer's
    failure and when the agent is gone; :func:`_rank_failure` calls it on an error."""

    def __init__(self, ctx: DistContext, out: Path, attempt: int) -> None:
        self.ctx, self.out, self.wd = ctx, out, ctx.watchdog
        self.owns = False
        """Set once every rank agreed that the run folder is this run's (written or resumed
        by it): before, nothing is written there (it may be another run's)."""
        self.agent = self.wd.parent_pid if self.wd is not None else None
        self.extra = {"attempt": attempt} if attempt else {}
        if self.wd is not None:
            self.wd.on_sigterm = self.on_sigterm
            self.wd.on_peer_failed = self.on_peer_failed
            self.wd.on_parent_died = self.on_agent_died

    def _claim(self) -> bool:
        """True for the one rank that writes the final state (the first to ask, among
        those that see the run folder)."""
        if not self.owns or not (self.out / "status.json").is_file():
            return False
        if self.wd is None:
            return self.ctx.is_main
        mine = str(self.ctx.rank)
        try:
            return self.wd.store.compare_set(f"{self.wd.prefix}ended", "", mine).decode() == mine
        except Exception:  # the store is gone with the agent
            return self.ctx.is_main

    def failed(self, error: str) -> None:
        if self._claim():
            mark_ended(self.out, "failed", error=error, **self.extra)

    def dead_peer(self) -> str | None:
        """``rank R of P died (how)`` for the first peer on this host that ended without
        saying so (:meth:`Watchdog.mark_end`); None when every peer lives or ended knowingly.
        Peers on other hosts cannot be looked at: their heartbeat names them instead."""
        if self.wd is None:
            return None
        host = socket.gethostname()
        for r in range(self.ctx.world_size):
            if r == self.ctx.rank or self.wd.ended(r) is not None:
                continue
            try:
                key = f"{self.wd.prefix}pid/{r}"
                where = self.wd.store.get(key).decode() if self.wd.store.check([key]) else ""
            except Exception:
                return None
            peer_host, _, pid = where.rpartition(":")
            if peer_host != host or not pid.isdigit():
                continue
            how = process_end(int(pid))
            if how is not None and self.wd.ended(r) is None:  # asked again: it may have just said
                return f"rank {r} of {self.ctx.world_size} died without an error ({how})"
        return None

    def signalled(self) -> bool:
        """True when a rank records that it was stopped by SIGTERM (the job is being stopped)."""
        fail = read_failure(self.wd.store, self.wd.prefix) if self.wd is not None else None
        return fail is not None and fail.kind == "signal"

    def stopped(self) -> None:
        """The job is being stopped by SIGTERM (torchrun's agent sends it to every worker when
        one ends, or when it is itself stopped): ``failed`` when a peer died first, else
        ``interrupted`` (rank 0 writes it)."""
        dead = self.dead_peer()
        if dead is not None:
            self.failed(dead)
        elif self.ctx.is_main and self._claim():
            mark_ended(self.out, "interrupted", signal="SIGTERM", **self.extra)

    def on_sigterm(self) -> None:
        if self.agent is not None and self._agent_gone():
            self.on_agent_died()  # the kernel's SIGTERM on the agent's death
        else:
            self.stopped()

    def _agent_gone(self, wait_s: float = 1.0) -> bool:
        """Whether the agent (this rank's parent) has died. The kernel sends the parent-death
        signal when the agent's *thread* that started this rank exits; when the agent is
        killed, its other threads may not have exited yet, and ``getppid()`` still names the
        agent for a moment. So a SIGTERM with the agent still our parent waits up to
        ``wait_s`` for that to change: an agent stopping its workers on purpose stays alive."""
        deadline = time.monotonic() + wait_s
        while os.getppid() == self.agent:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def on_peer_failed(self, fail: Failure) -> None:
        if fail.kind == "signal":  # a peer got SIGTERM first; this rank may never get its own
            self.stopped()
            return
        dead = self.dead_peer() if fail.kind == "stopped" else None
        if dead is not None:
            self.failed(dead)
        elif fail.kind == "user":
            self.failed(fail.message)
        else:
            self.failed(f"rank {fail.rank} of {self.ctx.world_size} failed: {fail.message}")

    def on_agent_died(self) -> None:
        """The agent (this rank's parent, the store's host) is gone: rank 0 records it."""
        if not (self.owns and self.ctx.is_main and (self.out / "status.json").is_file()):
            return
        if self.agent is not None and os.getppid() != self.agent:
            error = f"the torchrun agent (pid {self.agent}) died; its workers stopped"
        else:
            error = "the job's store (hosted by the torchrun agent) became unreachable"
        mark_ended(self.out, "failed", error=error, **self.extra)
