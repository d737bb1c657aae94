"""``commgnn cluster``: run ``commgnn train`` on an emulated multi-host cluster.

    commgnn cluster --hosts 4 --ranks-per-host 2 --rate 100mbit [--delay 5ms] [--loss 0.1%] \\
        -- train --dataset CS --model gcn --out runs/cs-100mbit

The train arguments are checked here, before any namespace is built, so a bad flag is
one line and exit 2 as with ``commgnn train``. ``--parts`` is hosts x ranks per host;
without ``--out`` the run directory is named here, once, for every rank.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from commgnn.errors import UserError


def add_parser(sub: Any) -> None:
    c = sub.add_parser("cluster", help="run `train` on H emulated hosts (network namespaces, shaped links)",
                       usage="commgnn cluster --hosts H --ranks-per-host R --rate RATE [--delay T] "
                             "[--loss P%%] -- train ARGS...")
    c.add_argument("--hosts", type=int, default=2, help="emulated machines (default: 2)")
    c.add_argument("--ranks-per-host", dest="ranks_per_host", type=int, default=1,
                   help="ranks per host, torchrun's --nproc-per-node (default: 1)")
    c.add_argument("--rate", default="1gbit", help="each host's link rate per direction, tc units (default: 1gbit)")
    c.add_argument("--delay", default="0ms", help="one-way delay per host, e.g. 5ms (netem, or the "
                   "user-space delay line where the kernel has no netem)")
    c.add_argument("--jitter", default="0ms", help="uniform jitter around --delay, e.g. 1ms")
    c.add_argument("--loss", default="0%", help="packet loss per host, e.g. 0.1%% (of 1500-byte packets)")
    c.add_argument("--rdzv-port", dest="rdzv_port", type=int, default=29400, help="rendezvous port on host 0")
    c.add_argument("--cleanup", action="store_true",
                   help="only remove namespaces and bridges left by killed `commgnn cluster` runs")
    c.add_argument("train_args", nargs=argparse.REMAINDER, help="-- train ARGS..., -- federate ARGS... or -- calibrate ARGS... (the job to run)")


def _job_args(ns: argparse.Namespace, world: int) -> tuple[list[str], Path | None]:
    """The job's command line (checked; a train job gains ``--out``) and its run directory."""
    from commgnn.runner.config import resolve_config
    from commgnn.cli.main import _flags, build_parser
    from commgnn.runner.run_dir import default_out_dir

    args = list(ns.train_args)
    if args[:1] == ["--"]:
        args = args[1:]
    if args[:1] == ["calibrate"]:
        build_parser().parse_args(args)  # a bad flag stops here, one line
        return args, None
    if args[:1] == ["federate"]:
        return _federate_args(args[1:], world)
    if args[:1] != ["train"]:
        raise UserError("give the job after --: train ARGS, federate ARGS or calibrate ARGS, e.g. "
                        "`commgnn cluster --hosts 2 -- train --dataset CS`")
    args = args[1:]
    tns = build_parser().parse_args(["train", *args])
    flags = _flags(tns)
    if flags.get("resume"):
        raise UserError("commgnn cluster runs a new job; --resume is not supported here")
    if flags.get("parts") not in (None, world):
        raise UserError(f"--parts {flags['parts']} differs from --hosts x --ranks-per-host = {world}")
    flags["parts"] = world
    if "place_hosts" not in flags and not flags.get("partition_dir") and ns.ranks_per_host > 1:
        flags["place_hosts"] = ns.hosts  # heavy halo pairs on one host (partition.hosts)
        args += ["--place-hosts", str(ns.hosts)]
    cfg = resolve_config(tns.config, flags, os.environ)  # a bad flag or key stops here, one line
    if cfg.output.out:
        return ["train", *args], Path(cfg.output.out)
    out = default_out_dir(replace(cfg, runtime=replace(cfg.runtime, parts=world)))
    return ["train", *args, "--out", str(out)], out


def _federate_args(args: list[str], world: int) -> tuple[list[str], Path]:
    """A federate job: rank 0 (host 0) serves, the clients live on the other ranks."""
    from commgnn.cli.federate import FLAG_KEYS, default_out_dir, resolve_federate_config
    from commgnn.cli.main import build_parser

    fns = build_parser().parse_args(["federate", *args])  # a bad flag stops here, one line
    flags = {dest: getattr(fns, dest, None) for dest in (*FLAG_KEYS, "seed")}
    flags = {k: v for k, v in flags.items() if v is not None}
    if flags.get("parts") not in (None, world):
        raise UserError(f"--parts {flags['parts']} differs from --hosts x --ranks-per-host = {world}")
    cfg = resolve_federate_config(fns.config, flags, os.environ)  # a bad flag or key stops here
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    extra = [] if cfg.output.out else ["--out", str(out)]
    return ["federate", *args, *extra], out


def cmd_cluster(ns: argparse.Namespace) -> int:
    from commgnn.cluster import ClusterConfig, remove_stale, run_cluster
    from commgnn.cluster.config import parse_percent, parse_rate, parse_time
    from commgnn.cluster.netns import check_rights

    if ns.cleanup:
        check_rights()
        removed = remove_stale()
        print(f"removed {len(removed)} stale object(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    cfg = ClusterConfig(hosts=ns.hosts, ranks_per_host=ns.ranks_per_host, rate_bps=parse_rate(ns.rate),
                        delay_s=parse_time(ns.delay), jitter_s=parse_time(ns.jitter), loss=parse_percent(ns.loss),
                        rdzv_port=ns.rdzv_port)
    args, out = _job_args(ns, cfg.world_size)
    check_rights()
    code = run_cluster(cfg, args)
    if code == 0 and out is not None and out.is_dir():  # the network the run saw, beside its records
        (out / "cluster.json").write_text(json.dumps({**asdict(cfg), "describe": cfg.describe()}, indent=1) + "\n")
    return code
