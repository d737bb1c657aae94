"""``commgnn.api.cluster`` (``commgnn cluster``): run a ``commgnn`` job on an emulated
multi-host cluster on this Linux machine (network namespaces, shaped links; it needs
``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``).

    from commgnn.api.cluster import run_emulated
    run_emulated(["train", "--dataset", "CS"], hosts=4, ranks_per_host=2, rate="100mbit")

The job runs as ``commgnn cluster ... -- JOB`` runs it (:func:`job_command`): ``--parts`` is
the cluster's ranks, a train or federate job without ``--out`` gets a run folder named once
for every rank, and a train job on hosts of several ranks places heavy halo pairs on one host.

``commgnn.cluster`` is the subpackage that builds the network; this module is the call.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

from commgnn.cluster.config import (CLUSTER_OPTIONS, ClusterConfig, parse_cores, parse_list, parse_percent,
                                    parse_rate, parse_straggle, parse_time)
from commgnn.errors import UserError

JOBS = ("train", "federate", "calibrate")
"""The commands a cluster runs."""


def cluster_config(config: ClusterConfig | None = None, **options: Any) -> ClusterConfig:
    """A :class:`ClusterConfig` from options by keyword (:data:`CLUSTER_OPTIONS`: ``hosts``,
    ``ranks_per_host``, ``rate`` (``"100mbit"`` or bits/s), ``delay``, ``jitter``, ``loss``,
    ``rdzv_port``, ``host_cpus``, ``host_rate`` (``"1gbit,100mbit"`` or bits/s each),
    ``straggle``), over ``config`` or the defaults."""
    for key, read in (("rate", parse_rate), ("delay", parse_time), ("jitter", parse_time), ("loss", parse_percent),
                      ("host_rate", parse_list(parse_rate)), ("host_cpus", parse_list(parse_cores)),
                      ("straggle", parse_straggle)):
        if isinstance(options.get(key), str):
            options[key] = read(options[key])
    CLUSTER_OPTIONS.unknown(list(options), "the cluster's")
    return CLUSTER_OPTIONS.resolve(None, options, {}, start=config)  # type: ignore[no-any-return]


def cleanup() -> list[str]:
    """Remove the namespaces and bridges left by killed emulations; their names."""
    from commgnn.cluster import cpu, remove_stale
    from commgnn.cluster.netns import check_rights

    check_rights()
    return list(remove_stale()) + cpu.remove_stale()


class _JobParser(argparse.ArgumentParser):
    """A job's command line parsed as its own command parses it; a bad flag is one line."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _parse_job(name: str, args: Sequence[str]) -> argparse.Namespace:
    p = _JobParser(prog=f"commgnn {name}", add_help=False)
    if name == "calibrate":
        from commgnn.api.calibrate import CALIBRATE_OPTIONS

        CALIBRATE_OPTIONS.add_arguments(p)
        return p.parse_args(list(args))
    from commgnn.federated.options import FEDERATE_OPTIONS
    from commgnn.runner.config import RUN_OPTIONS

    p.add_argument("--config")
    p.add_argument("--resume")
    (RUN_OPTIONS if name == "train" else FEDERATE_OPTIONS).add_arguments(p)
    return p.parse_args(list(args))


def job_command(job: Sequence[str], cfg: ClusterConfig, env: Mapping[str, str] | None = None
                ) -> tuple[list[str], Path | None]:
    """The command line each host runs for ``commgnn JOB...`` (``train ...``, ``federate
    ...`` or ``calibrate ...``, a leading ``--`` dropped) on the cluster ``cfg``, checked
    (a bad flag or TOML key is one line), and the job's run folder (None for calibrate).

    ``--parts`` must be absent or the cluster's ranks; a train or federate job without
    ``--out`` gets one, named here once for every rank; a train job whose hosts hold
    several ranks and that names no ``--place-hosts`` or ``--partition-dir`` gets
    ``--place-hosts HOSTS`` (heavy halo pairs on one host, ``partition.hosts``)."""
    env = os.environ if env is None else env
    args = list(job)
    if args[:1] == ["--"]:
        args = args[1:]
    if args[:1] not in [[j] for j in JOBS]:
        raise UserError("give the job after --: train ARGS, federate ARGS or calibrate ARGS, e.g. "
                        "`commgnn cluster --hosts 2 -- train --dataset CS`")
    name, args = args[0], args[1:]
    ns = _parse_job(name, args)
    if name == "calibrate":
        return [name, *args], None
    flags = {k: v for k, v in vars(ns).items() if v is not None and k != "config"}
    world = cfg.world_size
    if flags.pop("resume", None):
        raise UserError("commgnn cluster runs a new job; --resume is not supported here")
    if flags.get("parts") not in (None, world):
        raise UserError(f"--parts {flags['parts']} differs from --hosts x --ranks-per-host = {world}")
    if name == "federate":  # rank 0 (host 0) serves, the clients live on the other ranks
        from commgnn.federated.options import resolve_federate_config
        from commgnn.runner.federate import default_out_dir as federate_out_dir

        fcfg = resolve_federate_config(ns.config, flags, env)  # a bad flag or key stops here
        out = Path(fcfg.output.out) if fcfg.output.out else federate_out_dir(fcfg)
        return [name, *args, *([] if fcfg.output.out else ["--out", str(out)])], out
    from commgnn.runner.config import resolve_config
    from commgnn.runner.run_dir import default_out_dir

    flags["parts"] = world
    if "place_hosts" not in flags and not flags.get("partition_dir") and cfg.ranks_per_host > 1:
        flags["place_hosts"] = cfg.hosts
        args += ["--place-hosts", str(cfg.hosts)]
    rcfg = resolve_config(ns.config, flags, env)  # a bad flag or key stops here, one line
    if rcfg.output.out:
        return [name, *args], Path(rcfg.output.out)
    out = default_out_dir(replace(rcfg, runtime=replace(rcfg.runtime, parts=world)))
    return [name, *args, "--out", str(out)], out


def run_emulated(job: Sequence[str], config: ClusterConfig | None = None, *, out: str | Path | None = None,
                 **options: Any) -> int:
    """Run ``commgnn JOB...`` (``train ...``, ``federate ...`` or ``calibrate ...``, as on
    the command line) on every emulated host under torchrun, as ``commgnn cluster`` does
    (the job's command line is :func:`job_command`'s, checked before anything is built);
    its exit code. The job's run folder (``out``: default the one :func:`job_command`
    names) receives ``cluster.json`` (the network the run saw) when the job succeeds."""
    from commgnn.cluster import run_cluster
    from commgnn.cluster.netns import check_rights

    cfg = cluster_config(config, **options)
    args, folder = job_command(job, cfg)  # refused for the job before this machine's rights are checked
    check_rights()
    code = run_cluster(cfg, args)
    folder = Path(out) if out is not None else folder
    if code == 0 and folder is not None and folder.is_dir():
        (folder / "cluster.json").write_text(json.dumps({**asdict(cfg), "describe": cfg.describe()}, indent=1) + "\n")
    return int(code)
