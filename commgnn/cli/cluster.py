"""``commgnn cluster``: run ``commgnn train`` (``federate``, ``calibrate``) on an emulated
multi-host cluster (:func:`commgnn.api.cluster.run_emulated`).

    commgnn cluster --hosts 4 --ranks-per-host 2 --rate 100mbit [--delay 5ms] [--loss 0.1%] \\
        -- train --dataset CS --model gcn --out runs/cs-100mbit

The job's arguments are checked here, before any namespace is built, so a bad flag is
one line and exit 2 as with ``commgnn train``. ``--parts`` is hosts x ranks per host;
without ``--out`` the run directory is named here, once, for every rank.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from commgnn.cli.common import Parser, add_calibrate_arguments, add_federate_arguments, add_train_arguments, given
from commgnn.errors import UserError



def add_parser(sub: Any, help: str) -> None:
    from commgnn.cluster.config import CLUSTER_OPTIONS

    c = sub.add_parser("cluster", help=help, usage="commgnn cluster --hosts H --ranks-per-host R --rate RATE "
                       "[--delay T] [--loss P%%] -- train ARGS...")
    CLUSTER_OPTIONS.add_arguments(c)
    c.add_argument("--cleanup", action="store_true",
                   help="only remove namespaces and bridges left by killed `commgnn cluster` runs")
    c.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="-- train ARGS..., -- federate ARGS... or -- calibrate ARGS... (the job to run)")


def _job(name: str, args: list[str]) -> argparse.Namespace:
    """The job's arguments parsed as its own command would (a bad flag stops here, one line)."""
    p = Parser(prog=f"commgnn {name}")
    {"train": add_train_arguments, "federate": add_federate_arguments, "calibrate": add_calibrate_arguments}[name](p)
    return p.parse_args(args)


def _job_args(ns: argparse.Namespace, world: int) -> tuple[list[str], Path | None]:
    """The job's command line (checked; a train job gains ``--out``) and its run directory."""
    from commgnn.runner.config import resolve_config
    from commgnn.runner.run_dir import default_out_dir

    args = list(ns.train_args)
    if args[:1] == ["--"]:
        args = args[1:]
    if args[:1] not in (["train"], ["federate"], ["calibrate"]):
        raise UserError("give the job after --: train ARGS, federate ARGS or calibrate ARGS, e.g. "
                        "`commgnn cluster --hosts 2 -- train --dataset CS`")
    name, args = args[0], args[1:]
    jns = _job(name, args)
    if name == "calibrate":
        return [name, *args], None
    flags = given(jns)
    if flags.pop("resume", None):
        raise UserError("commgnn cluster runs a new job; --resume is not supported here")
    if flags.get("parts") not in (None, world):
        raise UserError(f"--parts {flags['parts']} differs from --hosts x --ranks-per-host = {world}")
    if name == "federate":  # rank 0 (host 0) serves, the clients live on the other ranks
        from commgnn.federated.options import resolve_federate_config
        from commgnn.runner.federate import default_out_dir as federate_out_dir

        fcfg = resolve_federate_config(jns.config, flags, os.environ)  # a bad flag or key stops here
        out = Path(fcfg.output.out) if fcfg.output.out else federate_out_dir(fcfg)
        return [name, *args, *([] if fcfg.output.out else ["--out", str(out)])], out
    flags["parts"] = world
    if name == "train" and "place_hosts" not in flags and not flags.get("partition_dir") and ns.ranks_per_host > 1:
        flags["place_hosts"] = ns.hosts  # heavy halo pairs on one host (partition.hosts)
        args += ["--place-hosts", str(ns.hosts)]
    cfg = resolve_config(jns.config, flags, os.environ)  # a bad flag or key stops here, one line
    if cfg.output.out:
        return [name, *args], Path(cfg.output.out)
    out = default_out_dir(replace(cfg, runtime=replace(cfg.runtime, parts=world)))
    return [name, *args, "--out", str(out)], out


def run(ns: argparse.Namespace) -> int:
    from commgnn.api.cluster import cleanup, cluster_config, run_emulated
    from commgnn.cluster.config import CLUSTER_OPTIONS

    if ns.cleanup:
        removed = cleanup()
        print(f"removed {len(removed)} stale object(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    cfg = cluster_config(**{k: v for k, v in given(ns).items() if k in CLUSTER_OPTIONS.by_dest})
    ns.hosts, ns.ranks_per_host = cfg.hosts, cfg.ranks_per_host  # the defaults filled in
    args, out = _job_args(ns, cfg.world_size)
    return run_emulated(args, cfg, out=out)
