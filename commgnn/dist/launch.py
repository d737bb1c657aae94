"""Start P local ranks and watch them, so that a dead rank never leaves the others hanging.

``torch.multiprocessing.spawn`` reports only after every process ends and cannot tell a
user error from a crash, so this small launcher (written here; the standard library's
``multiprocessing`` does the process work) does three things on top:

* each child reports a failure through a queue as ``(rank, kind, message)``; a
  :class:`~commgnn.errors.UserError` in any rank becomes one in the parent (exit code 2);
* the parent waits on all process sentinels at once; when one rank exits non-zero it
  gives the survivors ``grace_s`` to fail by themselves (their collectives fail fast
  when a peer's socket closes, or at the collective time-out), then terminates them;
* the raised :class:`~commgnn.errors.RankFailure` names the rank at fault (a killed or
  crashed rank, not a survivor whose collective failed because of it).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import multiprocessing.connection
import queue
import sys
import time
import traceback
from typing import Any, Callable

import torch.distributed

from commgnn.dist.context import LaunchInfo
from commgnn.errors import RankFailure, UserError


def _child(fn: Callable[..., Any], info: LaunchInfo, args: tuple, errq: Any) -> None:
    try:
        fn(info, *args)
    except UserError as exc:
        errq.put((info.rank, "user", str(exc)))
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except torch.distributed.DistError as exc:
        # A peer died or timed out: one line, not a traceback; the parent names the rank.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"commgnn: rank {info.rank}: collective failed ({first})", file=sys.stderr)
        errq.put((info.rank, "collective", first))
        sys.exit(1)
    except BaseException as exc:  # report, keep the traceback for bugs
        errq.put((info.rank, "error", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        traceback.print_exc()
        sys.exit(1)
    # Done, group destroyed, results written: leave without running C++ static destructors,
    # where gloo's background threads occasionally abort ("terminate called without an
    # active exception", seen here under load) and would turn a finished rank into a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(fn: Callable[..., Any], args: tuple, *, nprocs: int, master_addr: str, port: int,
                grace_s: float = 5.0) -> None:
    """Run ``fn(LaunchInfo, *args)`` in ``nprocs`` processes; raise if any rank fails.

    ``fn`` and ``args`` must be picklable (processes are spawned, not forked, so no
    torch or gloo state leaks into the children).
    """
    ctx = mp.get_context("spawn")
    errq = ctx.Queue()
    procs = []
    for rank in range(nprocs):
        info = LaunchInfo(rank=rank, world_size=nprocs, local_rank=rank, local_world_size=nprocs,
                          master_addr=master_addr, port=port)
        p = ctx.Process(target=_child, args=(fn, info, args, errq), name=f"commgnn-rank{rank}")
        p.start()
        procs.append(p)
    rank_of = {p.sentinel: r for r, p in enumerate(procs)}
    failed: list[tuple[int, int]] = []  # (rank, exit code) in the order they were seen
    terminated: set[int] = set()
    deadline: float | None = None
    try:
        alive = {p.sentinel for p in procs}
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
                for s in alive:
                    terminated.add(rank_of[s])
                    procs[rank_of[s]].terminate()
                for p in procs:
                    p.join(5)
                    if p.is_alive():
                        p.kill()
                break
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(1)
    if not failed:
        return
    reports: dict[int, tuple[str, str]] = {}
    while True:
        try:
            r, kind, msg = errq.get(timeout=0.2)
        except (queue.Empty, EOFError, OSError):
            break
        reports.setdefault(r, (kind, msg))
    # Blame the rank at fault, not a survivor whose collective failed because of it.
    culprits = [(r, c) for r, c in failed
                if r not in terminated and reports.get(r, ("crash", ""))[0] != "collective"]
    rank, code = (culprits or failed)[0]
    kind, msg = reports.get(rank, ("crash", ""))
    if kind == "user":
        raise UserError(msg)
    what = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
    detail = f": {msg}" if msg else ""
    raise RankFailure(f"rank {rank} of {nprocs} failed ({what}){detail}; the other ranks were stopped")
