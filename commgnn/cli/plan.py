"""``commgnn plan``: probe communication plans, rank them for a cluster, write the best.

    commgnn plan --dataset CS --model gcn --layers 3 --hosts 2 --ranks-per-host 2 \\
        --rate 50mbit [--delay 5ms | --net calibrated.json] --tolerance 0.5 --out plan.toml
    commgnn train --config plan.toml ...
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from commgnn.errors import UserError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="rank communication plans by predicted time to accuracy on a cluster")
    p.add_argument("--config", help="TOML file to start from")
    p.add_argument("--dataset", help="dataset name, 'synthetic' or a .pt graph")
    p.add_argument("--data-root", dest="data_root", help="folder with staged datasets")
    p.add_argument("--model", help="gcn | sage | gat")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--epochs", type=int, help="epochs of the planned run (written to the plan)")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", dest="ranks_per_host", type=int, default=1)
    p.add_argument("--rate", default="1gbit", help="each host's link rate (written cluster model)")
    p.add_argument("--delay", default="0ms", help="one-way delay between hosts (written cluster model)")
    p.add_argument("--net", help="a calibrated model (`commgnn calibrate --out`) instead of --rate/--delay")
    p.add_argument("--tolerance", type=float, default=0.5, help="accuracy points below exact allowed (default 0.5)")
    p.add_argument("--probe-epochs", dest="probe_epochs", default="30",
                   help="epochs per probe (default 30), or 'auto': as long as the exact probe takes to stop "
                        "improving (--probe-patience epochs without a better validation accuracy)")
    p.add_argument("--probe-patience", dest="probe_patience", type=int, default=20,
                   help="with --probe-epochs auto: epochs without improvement that end the exact probe (default 20)")
    p.add_argument("--compute-scale", dest="compute_scale", type=float,
                   help="factor on the probes' compute (default: the exact probe's measured compute alone over "
                        "shared, at most 1, else cores / ranks)")
    p.add_argument("--probe-net", dest="probe_net",
                   help="the probes' own link, calibrated (`commgnn calibrate --parts P` here): what it leaves "
                        "unexplained in each probe joins that plan's priced communication, half overlapping it")
    p.add_argument("--min-gain", dest="min_gain", type=float, default=0.1,
                   help="choose a plan over exact only if it is predicted at least this fraction sooner to the "
                        "target, and of plans predicted within this fraction of the fastest, the one with the "
                        "cheapest epoch (default 0.1: probes are one seed's curve; 0: the fastest, always)")
    p.add_argument("--shared-cores", dest="shared_cores", action="store_true",
                   help="the cluster's hosts share this machine's cores (a `commgnn cluster` emulation): no "
                        "epoch is predicted shorter than its probe's own compute")
    p.add_argument("--plans", nargs="+", help="only these candidate names (exact is always probed)")
    p.add_argument("--workdir", help="keep the probe runs here (reruns reuse finished probes)")
    p.add_argument("--out", required=True, help="TOML file for the chosen plan")


def _read_model(path: str, flag: str) -> Any:
    from commgnn.netmodel import ClusterModel

    try:
        return ClusterModel.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{flag} {path}: not a calibrated model ({exc})") from None


def cmd_plan(ns: argparse.Namespace) -> int:
    from commgnn.runner.config import resolve_config
    from commgnn.cluster.config import parse_rate, parse_time
    from commgnn.netmodel import ClusterModel
    from commgnn.planner import choose, plan, plan_config

    if ns.tolerance < 0:
        raise UserError(f"--tolerance must be >= 0 points, got {ns.tolerance}")
    if ns.probe_epochs == "auto":
        probe_epochs = None
    else:
        try:
            probe_epochs = int(ns.probe_epochs)
        except ValueError:
            raise UserError(f"--probe-epochs must be a number of epochs or 'auto', got {ns.probe_epochs!r}") from None
        if probe_epochs < 2:
            raise UserError(f"--probe-epochs must be at least 2, got {probe_epochs}")
    if ns.probe_patience < 1:
        raise UserError(f"--probe-patience must be at least 1 epoch, got {ns.probe_patience}")
    out = Path(ns.out)
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist")
    flags = {k: getattr(ns, k) for k in ("dataset", "data_root", "model", "layers", "hidden", "lr", "seed", "epochs")
             if getattr(ns, k) is not None}
    base = resolve_config(ns.config, flags, os.environ)
    probe_model = _read_model(ns.probe_net, "--probe-net") if ns.probe_net else None
    if ns.net:
        model = _read_model(ns.net, "--net")
    else:
        if ns.hosts < 1 or ns.ranks_per_host < 1 or ns.hosts * ns.ranks_per_host < 2:
            raise UserError("the cluster needs at least 2 ranks (--hosts x --ranks-per-host)")
        model = ClusterModel.written(ns.hosts, ns.ranks_per_host, parse_rate(ns.rate), delay_s=parse_time(ns.delay))
    workdir = Path(ns.workdir) if ns.workdir else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    ranked = plan(base, model, tolerance=ns.tolerance, probe_epochs=probe_epochs, probe_patience=ns.probe_patience,
                  compute_scale=ns.compute_scale, workdir=workdir, names=ns.plans, probe_model=probe_model,
                  min_gain=ns.min_gain, shared_cores=ns.shared_cores)
    extra = f" {'residual s':>10s}" if probe_model is not None else ""
    print(f"{'plan':40s} {'best val':>8s} {'s/epoch':>8s} {'comm s':>8s} {'MB/epoch':>9s} {'to target':>10s}{extra}")
    for r in ranked:
        reach = f"{r.time_to_target_s:.1f} s" if r.time_to_target_s is not None else "not reached"
        extra = f" {r.overhead_s:10.3f}" if probe_model is not None else ""
        print(f"{r.name:40s} {r.best_val:8.4f} {r.epoch_s:8.3f} {r.comm_s:8.3f} {r.bytes_per_epoch / 1e6:9.2f} "
              f"{reach:>10s}{extra}")
    best = choose(ranked, ns.min_gain)
    if best is not ranked[0] and best.name == "exact":
        print(f"{ranked[0].name} is predicted less than {ns.min_gain:.0%} sooner than exact (--min-gain): "
              "within the probes' noise, so exact")
    elif best is not ranked[0]:
        print(f"{best.name} is predicted within {ns.min_gain:.0%} of {ranked[0].name}'s time to the target "
              f"(--min-gain), with a cheaper epoch ({best.epoch_s:.3f} s against {ranked[0].epoch_s:.3f} s): "
              "within the probes' noise, so the cheaper epoch")
    out.write_text(plan_config(base, best, model))
    (out.with_suffix(".json")).write_text(
        json.dumps([{**r.__dict__, "chosen": r is best} for r in ranked], indent=1) + "\n")
    print(f"chosen: {best.name} -> {out}")
    return 0
