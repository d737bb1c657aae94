"""``commgnn cluster``: run ``commgnn train`` (``federate``, ``calibrate``) on an emulated
multi-host cluster (:func:`commgnn.api.cluster.run_emulated`).

    commgnn cluster --hosts 4 --ranks-per-host 2 --rate 100mbit [--delay 5ms] [--loss 0.1%] \\
        -- train --dataset CS --model gcn --out runs/cs-100mbit

The command parses its own flags; the job's (checked before any namespace is built, so a
bad flag is one line and exit 2 as with ``commgnn train``; ``--parts`` is hosts x ranks per
host; without ``--out`` the run directory is named once, for every rank) are
:func:`commgnn.api.cluster.job_command`'s.
"""

from __future__ import annotations

import argparse
from typing import Any

from commgnn.cli.common import given


def add_parser(sub: Any, help: str) -> None:
    from commgnn.cluster.config import CLUSTER_OPTIONS

    c = sub.add_parser("cluster", help=help, usage="commgnn cluster --hosts H --ranks-per-host R --rate RATE "
                       "[--delay T] [--loss P%%] -- train ARGS...")
    CLUSTER_OPTIONS.add_arguments(c)
    c.add_argument("--cleanup", action="store_true",
                   help="only remove namespaces and bridges left by killed `commgnn cluster` runs")
    c.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="-- train ARGS..., -- federate ARGS... or -- calibrate ARGS... (the job to run)")


def run(ns: argparse.Namespace) -> int:
    from commgnn.api.cluster import cleanup, cluster_config, run_emulated
    from commgnn.cluster.config import CLUSTER_OPTIONS

    if ns.cleanup:
        removed = cleanup()
        print(f"removed {len(removed)} stale object(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    cfg = cluster_config(**{k: v for k, v in given(ns).items() if k in CLUSTER_OPTIONS.by_dest})
    return run_emulated(ns.train_args, cfg)
