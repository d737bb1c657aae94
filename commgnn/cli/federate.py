"""``commgnn federate``: federated GNN training (FedAvg / FedProx over graph clients).

    commgnn federate --dataset cora --clients 5 --split louvain --rounds 100 \\
        --secure-agg --dp-epsilon 4 --uplink-bits 8 --policy policy.toml --out runs/fed

Every flag sets a key of :class:`commgnn.federated.config.FederateConfig`
(:data:`commgnn.federated.options.FEDERATE_OPTIONS`) and overrides ``--config FILE.toml``,
which is read strictly (unknown keys are errors). The command parses its arguments and calls
:func:`commgnn.api.federate.run_federation` (``--resume RUN_DIR``:
:func:`commgnn.api.federate.resume_federated`); the run folder, its files and the failure
rules are those of :mod:`commgnn.runner.federate`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from commgnn.cli.common import add_federate_arguments, given

MB = 1e6


def add_parser(sub: Any, help: str) -> None:
    add_federate_arguments(sub.add_parser("federate", help=help))


def run(ns: argparse.Namespace) -> int:
    return cmd_federate(ns)


def cmd_federate(ns: argparse.Namespace) -> int:
    from commgnn.api.federate import resume_federated, run_federation
    from commgnn.federated.options import FEDERATE_OPTIONS, resolve_federate_config

    flags = given(ns)
    resume = flags.pop("resume", None)
    if resume is not None:
        FEDERATE_OPTIONS.check_resume({**flags, "config": ns.config})
        result = resume_federated(resume, env=os.environ, **flags)
    else:
        result = run_federation(resolve_federate_config(ns.config, flags, os.environ), env=os.environ)
    if result is None:  # a torchrun rank other than 0: the server reports
        return 0
    summary, out = result.summary, result.run_dir
    worst = summary.get("worst_client_acc")
    worst_text = "n/a" if worst is None else f"{worst:.4f}"
    line = (f"test accuracy {summary['test_acc']:.4f} (best val round {summary.get('best_round')})  "
            f"worst client {worst_text}  uplink {summary['uplink_bytes_total'] / MB:.3f} MB")
    if "epsilon" in summary:
        line += f"  epsilon {summary['epsilon']:.3f} (delta {summary['delta']:g})"
    print(f"{line} -> {out}")
    return 0
