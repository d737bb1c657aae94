"""Run a federation in this process or across ranks, the same way ``commgnn train`` does.

``runtime.parts = 1``: the server and every client in this process. ``parts = W > 1``: W
local gloo ranks started by :func:`commgnn.distributed.spawn.spawn_ranks` (rank 0 the server),
or, under ``torchrun``, the launcher's ranks (:func:`run_rank` with its
:class:`~commgnn.distributed.context.LaunchInfo`). A dead rank makes the others fail within the
collective time-out, naming it. The server's summary comes back to the caller.
"""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

from commgnn.distributed.context import LaunchInfo, free_port, init_distributed, shutdown
from commgnn.distributed.spawn import rank_failure, spawn_ranks
from commgnn.federated.config import FederateConfig
from commgnn.federated.engine import Federation


def run_rank(info: LaunchInfo, cfg: FederateConfig, result_path: str | None, graph: Any = None,
             on_eval: Callable[[dict[str, Any]], None] | None = None,
             torchrun: bool = False) -> dict[str, Any] | None:
    """One rank's part; the server (rank 0) returns the summary and, with ``result_path``,
    pickles it there for the launcher. ``torchrun``: no commgnn launcher watches the ranks,
    so a failure is posted for the others here and comes back as one line naming the rank
    at fault (a peer's bad input as its own :class:`~commgnn.errors.UserError`), at once
    rather than after the collective time-out."""
    ctx = init_distributed(info, cfg.runtime)
    try:
        summary = Federation(cfg, graph, ctx=ctx).run(on_eval if info.rank == 0 else None)
    except BaseException as exc:
        if not torchrun:
            raise  # the launcher's child wrapper reports it
        raise rank_failure(ctx, exc) from None
    if info.rank == 0 and result_path is not None:
        Path(result_path).write_bytes(pickle.dumps(summary))
    shutdown(ctx)
    return summary


def federate(cfg: FederateConfig, *, graph: Any = None,
             on_eval: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train ``cfg`` on ``cfg.runtime.parts`` local ranks and return the server's summary.
    ``on_eval`` (one process only: it cannot cross a process boundary) gets every evaluation row."""
    parts = cfg.runtime.parts
    if parts == 1:
        summary = Federation(cfg, graph).run(on_eval)
        assert summary is not None
        return summary
    with tempfile.TemporaryDirectory(prefix="commgnn-federate-") as tmp:
        result = Path(tmp) / "summary.pkl"
        port = cfg.runtime.port or free_port(cfg.runtime.master_addr)
        spawn_ranks(run_rank, (cfg, str(result), graph), nprocs=parts, master_addr=cfg.runtime.master_addr,
                    port=port, heartbeat_s=cfg.runtime.heartbeat_timeout_s)
        return pickle.loads(result.read_bytes())
