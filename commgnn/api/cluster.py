"""``commgnn.api.cluster`` (``commgnn cluster``): run a ``commgnn`` job on an emulated
multi-host cluster on this Linux machine (network namespaces, shaped links; it needs
``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``).

    from commgnn.api.cluster import run_emulated
    run_emulated(["train", "--dataset", "CS", "--out", "runs/cs"], hosts=4, ranks_per_host=2,
                 rate="100mbit", out="runs/cs")

``commgnn.cluster`` is the subpackage that builds the network; this module is the call.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from commgnn.cluster.config import CLUSTER_OPTIONS, ClusterConfig, parse_percent, parse_rate, parse_time


def cluster_config(config: ClusterConfig | None = None, **options: Any) -> ClusterConfig:
    """A :class:`ClusterConfig` from options by keyword (:data:`CLUSTER_OPTIONS`: ``hosts``,
    ``ranks_per_host``, ``rate`` (``"100mbit"`` or bits/s), ``delay``, ``jitter``, ``loss``,
    ``rdzv_port``), over ``config`` or the defaults."""
    for key, read in (("rate", parse_rate), ("delay", parse_time), ("jitter", parse_time), ("loss", parse_percent)):
        if isinstance(options.get(key), str):
            options[key] = read(options[key])
    CLUSTER_OPTIONS.unknown(list(options), "the cluster's")
    return CLUSTER_OPTIONS.resolve(None, options, {}, start=config)  # type: ignore[no-any-return]


def cleanup() -> list[str]:
    """Remove the namespaces and bridges left by killed emulations; their names."""
    from commgnn.cluster import remove_stale
    from commgnn.cluster.netns import check_rights

    check_rights()
    return list(remove_stale())


def run_emulated(job: Sequence[str], config: ClusterConfig | None = None, *, out: str | Path | None = None,
                 **options: Any) -> int:
    """Run ``commgnn JOB...`` (``train ...``, ``federate ...`` or ``calibrate ...``, as on
    the command line, with ``--parts`` equal to the cluster's ranks) on every emulated host
    under torchrun; its exit code. ``out``: the job's run folder, which receives
    ``cluster.json`` (the network the run saw) when the job succeeds."""
    from commgnn.cluster import run_cluster
    from commgnn.cluster.netns import check_rights

    cfg = cluster_config(config, **options)
    check_rights()
    code = run_cluster(cfg, list(job))
    folder = Path(out) if out is not None else None
    if code == 0 and folder is not None and folder.is_dir():
        (folder / "cluster.json").write_text(json.dumps({**asdict(cfg), "describe": cfg.describe()}, indent=1) + "\n")
    return int(code)
