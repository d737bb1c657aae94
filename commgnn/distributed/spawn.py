"""Start P local ranks, watch them, and end the job fast and cleanly when anything fails.

``torch.multiprocessing.spawn`` reports only after every process ends, cannot tell a user
error from a crash, and leaves its children running when it is killed. This launcher
(written here; the standard library's ``multiprocessing`` does the process work) adds:

* **A store in the launcher.** The parent hosts the job's ``TCPStore``; ranks connect to it
  as clients. It outlives any rank, so a dead or stopped rank 0 cannot take the failure
  record with it (see :mod:`commgnn.distributed.watchdog` for what the ranks keep there).
* **Fast starts.** On Linux without CUDA, ranks fork from a fork server that imported torch
  and PyG once, instead of each importing them (see :mod:`commgnn.distributed.forkserver`).
* **No orphans.** Each rank asks the kernel to SIGKILL it when its parent dies: the launcher,
  or the fork server, which the kernel kills when the launcher dies. That holds whatever
  killed the launcher (SIGKILL and the OOM killer included). On Ctrl-C or SIGTERM the
  launcher kills its ranks before it returns.
* **Fail fast, blame right.** The parent waits on all process sentinels at once. When one
  rank exits non-zero, the failure record says who is at fault (the rank that raised, or
  the one whose heartbeat stopped); survivors have already ended themselves through their
  watchdog, and whatever is left after ``grace_s`` is killed. The raised
  :class:`~commgnn.errors.RankFailure` reads ``rank R of P failed: <cause>``; a
  :class:`~commgnn.errors.UserError` raised in a rank is raised again here (exit 2).
* **Logs, not tracebacks.** With ``log_dir``, each rank's standard error (Python and C++
  alike) goes to ``log_dir/rank{r}.log``; the full traceback of a failure is there, and
  the terminal gets one line. Rank 0's own progress output still reaches the terminal.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, TextIO

import torch
import torch.distributed as dist

from commgnn.distributed.context import DistContext, LaunchInfo
from commgnn.distributed.forkserver import Stream, in_forked_rank, main_module_hidden, start_context
from commgnn.distributed.watchdog import (EXIT_PEER_FAILED, EXIT_SIGTERM, Failure, block_sigterm, die_with_launcher,
                                   read_failure)
from commgnn.errors import RankFailure, UserError

EXIT_USER_ERROR = 2


def host_store(addr: str, port: int) -> dist.TCPStore:
    """The job's store, hosted here, listening on ``addr:port`` only (127.0.0.1 for local
    ranks: never every interface). torch's ``TCPStore`` binds its server to the wildcard
    address whatever host it is given, so the listening socket is made here, bound to
    ``addr``, and handed over (``master_listen_fd``, which the store then owns)."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UserError(f"runtime.master_addr {addr!r} does not resolve: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server does
        sock.bind(where)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {addr} port {port} ({exc.strerror}); choose another with "
                        f"--port, or --port 0 to pick a free one") from None
    fd = sock.detach()
    try:
        return dist.TCPStore(addr, port, None, True, timeout=_dt.timedelta(seconds=30), wait_for_workers=False,
                             master_listen_fd=fd, use_libuv=True)
    except BaseException:
        os.close(fd)
        raise


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (the one line a person is shown)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


_COLLECTIVE_SIGNS = ("gloo", "nccl", "connection reset", "connection closed", "broken pipe", "timed out")


def is_collective_failure(exc: BaseException) -> bool:
    """True for an error raised by a collective because a peer died or stopped: torch's
    ``DistError`` family, or the plain ``RuntimeError`` that gloo raises on a reset
    connection. Such an error is not this rank's fault, so it claims no blame."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(s in text for s in _COLLECTIVE_SIGNS)


def _redirect_stderr(log_dir: str, rank: int) -> TextIO:
    """Send fd 2 (C++ and Python stderr) to the rank's log; return the log file. Rank 0 keeps
    the terminal for its progress bar and summary through ``sys.stderr``."""
    path = Path(log_dir) / f"rank{rank}.log"
    log = open(path, "a", buffering=1)
    ui = os.dup(2)
    os.dup2(log.fileno(), 2)
    sys.stderr = os.fdopen(ui, "w", buffering=1) if rank == 0 else log

    def to_log(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        log.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = to_log
    return log


def _report(info: LaunchInfo, kind: str, message: str) -> None:
    """Post this rank's failure to the launcher's store (first writer wins)."""
    try:
        store = dist.TCPStore(info.master_addr, info.port, None, False, timeout=_dt.timedelta(seconds=5))
        store.compare_set("commgnn/fail", "", Failure(info.rank, kind, message).encode())
    except Exception:
        pass  # the launcher still has the exit code


def _child(job: bytes, env: dict[str, str], start_method: str, streams: tuple[int, int] | None,
           info: LaunchInfo, log_dir: str | None) -> None:
    # ``streams``: the launcher's stdout and stderr, already in place (Stream's unpickling),
    # or None (spawned: inherited).
    assert info.launcher_pid is not None
    # Spawned by the launcher, or forked by its fork server (see commgnn.distributed.forkserver).
    info = dataclasses.replace(info, parent_pid=die_with_launcher(info.launcher_pid))
    in_forked_rank()
    if env != os.environ:  # the launcher's at this launch, before anything is unpickled
        os.environ.clear()
        os.environ.update(env)
    # The launcher's default start method, set again after the environment (multiprocessing
    # already applies it; libraries read it: numba takes a named semaphore, never freed by
    # os._exit, under any method but "fork").
    mp.set_start_method(start_method, force=True)
    block_sigterm()  # before gloo starts its threads; the watchdog takes SIGTERM
    log: TextIO = sys.stderr
    if log_dir is not None:
        log = _redirect_stderr(log_dir, info.rank)
        _log(log, f"commgnn rank {info.rank} of {info.world_size}: pid {os.getpid()}")
    try:
        fn, args = pickle.loads(job)
        fn(info, *args)
    except UserError as exc:
        _report(info, "user", str(exc))
        _exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        _exit(130)
    except BaseException as exc:
        if is_collective_failure(exc):
            # A peer died or stopped. Not this rank's fault: the failure record (the
            # culprit's, or a watchdog's) or the culprit's exit code names it.
            if log_dir is not None:  # on a terminal the launcher's one line says it all
                _log(log, f"rank {info.rank}: collective failed ({first_line(exc)})")
            _exit(EXIT_PEER_FAILED)
        _report(info, "error", first_line(exc))  # first: the log may sit on a full disk
        _log(log, traceback.format_exc())
        _exit(1)
    # Done, group destroyed, results written: leave without running C++ static destructors,
    # where gloo's background threads occasionally abort ("terminate called without an
    # active exception", seen here under load) and would turn a finished rank into a failure.
    _exit(0)


def _log(log: TextIO, text: str) -> None:
    try:
        print(text, file=log)
    except (OSError, ValueError):
        pass


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _kill(procs: list[Any]) -> None:
    """SIGKILL every live rank (a stopped one too: SIGTERM would stay pending) and reap it."""
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.join(5)


def spawn_ranks(fn: Callable[..., Any], args: tuple, *, nprocs: int, master_addr: str, port: int,
                grace_s: float = 3.0, log_dir: str | None = None,
                heartbeat_s: float = 30.0, cuda: bool | None = None) -> None:
    """Run ``fn(LaunchInfo, *args)`` in ``nprocs`` processes; raise if any rank fails.

    ``port`` is where this process hosts the job's store (the ranks' rendezvous).
    ``fn`` and ``args`` must be picklable without the launcher's ``__main__``, which the
    ranks never import (:func:`~commgnn.distributed.forkserver.main_module_hidden`): ranks never fork from this process, so none of
    its torch or gloo state (the store's threads included) leaks into them. On Linux without
    CUDA they fork from a fork server that imported torch and PyG once
    (:mod:`commgnn.distributed.forkserver`); otherwise each is spawned and imports them itself.
    ``heartbeat_s``: a rank whose heartbeat stops for this long (after set-up) is declared
    failed by its peers. ``cuda``: whether the ranks will use CUDA (None: whether there is
    a GPU here).
    """
    store = host_store(master_addr, port)
    ctx = start_context(cuda=torch.cuda.is_available() if cuda is None else cuda)
    # Pickled here, plainly: multiprocessing's own pickler would send every tensor as a
    # shared-memory file descriptor, and the fork server passes at most 256 of them.
    job = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    env, method, streams = dict(os.environ), mp.get_start_method(), Stream.pair(ctx)
    procs = []
    try:
        with main_module_hidden():  # ranks never import the user's __main__ (script, stdin, notebook)
            for rank in range(nprocs):
                info = LaunchInfo(rank=rank, world_size=nprocs, local_rank=rank, local_world_size=nprocs,
                                  master_addr=master_addr, port=port, launcher_pid=os.getpid(),
                                  heartbeat_s=heartbeat_s)
                p = ctx.Process(target=_child, args=(job, env, method, streams, info, log_dir),
                                name=f"commgnn-rank{rank}")
                p.start()
                procs.append(p)
        failed = _watch(procs, grace_s)
    except BaseException:  # Ctrl-C, SIGTERM, or a failure to start: no rank outlives us
        _kill(procs)
        raise
    if failed:
        server_died = ctx.get_start_method() == "forkserver" and len(failed) == nprocs \
            and all(code == 255 for _, code in failed)
        _raise_failure(failed, read_failure(store), nprocs, log_dir, server_died)


def _watch(procs: list[Any], grace_s: float) -> list[tuple[int, int]]:
    """Wait for every rank; after the first failure give the rest ``grace_s`` to end on their
    own (their watchdogs end them within about a second), then kill them. Returns the
    failures as (rank, exit code) in the order they were seen."""
    rank_of = {p.sentinel: r for r, p in enumerate(procs)}
    alive = set(rank_of)
    failed: list[tuple[int, int]] = []
    deadline: float | None = None
    while alive:
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        for s in multiprocessing.connection.wait(list(alive), timeout=wait_s):
            alive.discard(s)
            r = rank_of[s]
            procs[r].join()
            if procs[r].exitcode != 0:
                failed.append((r, procs[r].exitcode))
                if deadline is None:
                    deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() >= deadline and alive:
            _kill(procs)
            break
    return failed


def _raise_failure(failed: list[tuple[int, int]], record: Failure | None, nprocs: int,
                   log_dir: str | None, server_died: bool = False) -> None:
    """Name the rank at fault: the failure record if a rank wrote one, else the first rank
    that died by itself (not a survivor ended because of it)."""
    if record is not None and record.kind == "user":
        raise UserError(record.message)
    if record is not None:
        rank, cause = record.rank, record.message
    else:
        by_itself = [(r, c) for r, c in failed if c != EXIT_PEER_FAILED]
        rank, code = (by_itself or failed)[0]
        if code == EXIT_SIGTERM or code == -signal.SIGTERM:
            cause = "stopped by SIGTERM"
        elif code < 0:
            cause = f"killed by {signal.Signals(-code).name}"
        elif server_died:  # 255 is what multiprocessing reports for ranks of a dead fork server
            cause = "exited with code 255 (every rank did: their fork server was killed)"
        else:
            cause = f"exited with code {code}"
    where = f" (log: {Path(log_dir) / f'rank{rank}.log'})" if log_dir and record is not None \
        and record.kind == "error" else ""
    raise RankFailure(f"rank {rank} of {nprocs} failed: {cause}{where}")


def rank_failure(ctx: DistContext, exc: BaseException, log_path: Path | None = None) -> BaseException:
    """Under torchrun, where no commgnn launcher names the culprit: record this rank's
    failure for the others (their watchdogs end them) and return the one-line error this
    process raises instead. A collective that failed here is a peer's fault, so the peer is
    named (it posted its error, or its heartbeat stopped); a peer's bad input comes back as
    that :class:`UserError`. A traceback of an unexpected error goes to ``log_path``."""
    wd = ctx.watchdog
    if is_collective_failure(exc) and wd is not None:
        culprit = wd.wait_for_culprit(limit_s=min(10.0, ctx.timeout_s))
        if culprit is None:
            return RankFailure(f"rank {ctx.rank} of {ctx.world_size}: a collective failed "
                               f"({first_line(exc)}) and no peer was found at fault")
        if culprit.kind == "user":
            return UserError(culprit.message)
        return RankFailure(f"rank {culprit.rank} of {ctx.world_size} failed: {culprit.message}")
    if isinstance(exc, KeyboardInterrupt):
        return exc
    user = isinstance(exc, UserError)
    cause = str(exc) if user else first_line(exc)
    if not user and log_path is not None:  # the traceback goes to a log, not the terminal
        try:
            with open(log_path, "a") as log:
                traceback.print_exception(exc, file=log)
        except OSError:
            pass
    if wd is not None:
        wd.report("user" if user else "error", cause)
    return exc if user else RankFailure(f"rank {ctx.rank} of {ctx.world_size} failed: {cause}")
