"""``commgnn plan``: rank communication plans by predicted time to accuracy on a cluster.

A plan is a set of levers: halo codecs and staleness, the gradient strategy, and, for
GraphSAGE, mini-batch training. Each candidate is trained for ``probe_epochs`` epochs on
local ranks (as many as the cluster has), which gives its accuracy curve, its per-pair
bytes and its compute per epoch. The cluster model (written: a rate and a delay, or
calibrated: ``commgnn calibrate``) prices each probe's bytes (:mod:`commgnn.netmodel.predict`);
compute is the probe's busiest rank's, times ``compute_scale`` (the probe's ranks share
this machine's cores, a real cluster's hosts do not; the default scale is cores / ranks
when the ranks outnumber the cores). The target is the exact probe's best validation
accuracy less ``tolerance`` points; a plan's score is the predicted time (cumulative
epochs) until its validation accuracy reaches the target, and plans that never reach it
within the probe are ranked after those that do. The best plan is written as a config
that ``commgnn train --config`` accepts.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from commgnn.api import run
from commgnn.cli.config import RunConfig
from commgnn.config import dump_toml, from_dict, set_path, to_dict
from commgnn.errors import UserError
from commgnn.netmodel import ClusterModel
from commgnn.netmodel.predict import per_epoch_traffic, read_metrics_rows

HALO_PLANS: dict[str, dict[str, Any]] = {
    "exact": {},
    "8-bit halo": {"comm.halo.bits": 8},
    "4-bit halo": {"comm.halo.bits": 4},
    "2-bit halo": {"comm.halo.bits": 2},
    "pipelined": {"comm.halo.staleness.mode": "pipeline"},
    "pipelined + 4-bit": {"comm.halo.staleness.mode": "pipeline", "comm.halo.bits": 4},
    "sampled 50% + 8-bit": {"comm.halo.sample_rate": 0.5, "comm.halo.bits": 8},
}
GRAD_PLANS: dict[str, dict[str, Any]] = {"powersgd r1": {"comm.grad.strategy": "powersgd", "comm.grad.rank": 1}}
LOSSLESS_GCN = {"comm.halo.precompute": True, "comm.halo.transform_first": True}


def candidates(base: RunConfig) -> dict[str, dict[str, Any]]:
    """The plan grid for ``base``'s model: halo plans, each with the default gradient
    all-reduce, the best-known lossless GCN levers, PowerSGD on exact and 4-bit halos, and
    neighbour-sampled mini-batch training for GraphSAGE."""
    plans = dict(HALO_PLANS)
    if base.model.name == "gcn":
        plans["precompute + transform-first"] = dict(LOSSLESS_GCN)
        plans["precompute + transform-first + 4-bit"] = {**LOSSLESS_GCN, "comm.halo.bits": 4}
    for g, levers in GRAD_PLANS.items():
        plans[f"exact + {g}"] = dict(levers)
        plans[f"4-bit halo + {g}"] = {"comm.halo.bits": 4, **levers}
    if base.model.name == "sage":
        fan = [15, 10, 5, 5][: base.model.layers] + [5] * max(0, base.model.layers - 4)
        plans["mini-batch neighbour"] = {"train.mode": "minibatch", "minibatch.sampler": "neighbor",
                                         "minibatch.fanout": fan}
    return plans


@dataclass(frozen=True)
class PlanResult:
    name: str
    levers: dict[str, Any]
    best_val: float
    epoch_s: float
    """Predicted seconds per epoch on the cluster."""
    comm_s: float
    time_to_target_s: float | None
    """Predicted seconds until validation accuracy reaches the target; None: not in the probe."""
    bytes_per_epoch: float


def _with(base: RunConfig, levers: Mapping[str, Any], **paths: Any) -> RunConfig:
    data = to_dict(base)
    for key, value in {**levers, **paths}.items():
        set_path(data, key, value)
    return from_dict(RunConfig, data)


def _score(run_dir: Path, model: ClusterModel, compute_scale: float) -> tuple[list[float], list[float], float, float]:
    """Per-epoch validation accuracies, predicted cumulative seconds, predicted comm s/epoch
    and bytes per epoch of a probe run."""
    rows = read_metrics_rows(run_dir)
    pairs, calls = per_epoch_traffic(run_dir)
    comm = model.predict_epoch(0.0, pairs, calls)["comm"]
    t, cum = 0.0, []
    for r in rows:
        b = r["time_busiest_s"]
        t += compute_scale * (b["compute"] + b.get("sample", 0.0)) + comm
        cum.append(t)
    return [r["val_acc"] for r in rows], cum, comm, statistics.mean(r["total_bytes"] for r in rows)


def plan(base: RunConfig, model: ClusterModel, *, tolerance: float, probe_epochs: int = 30,
         compute_scale: float | None = None, workdir: Path | None = None,
         names: list[str] | None = None, log: Any = print) -> list[PlanResult]:
    """Probe every candidate and rank them (best first)."""
    P = model.world_size
    if compute_scale is None:
        compute_scale = min(1.0, (os.cpu_count() or 1) / P)
    grid = candidates(base)
    if names:
        unknown = [n for n in names if n not in grid]
        if unknown:
            raise UserError(f"unknown plan(s) {', '.join(unknown)}; choose from: {', '.join(grid)}")
        grid = {n: grid[n] for n in ["exact", *names] if n in grid}
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="commgnn-plan-")) if own else workdir
    assert work is not None
    hosts_flag = {"partition.hosts": model.hosts} if model.ranks_per_host > 1 else {}
    results, curves = [], {}
    try:
        for name, levers in grid.items():
            out = work / "".join(c if c.isalnum() else "-" for c in name)
            cfg = _with(base, {**levers, **hosts_flag}, **{"runtime.parts": P, "train.epochs": probe_epochs,
                                                           "train.patience": 0, "output.quiet": True,
                                                           "output.out": str(out), "energy.track": False})
            if not (out / "summary.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                log(f"probe: {name} ({probe_epochs} epochs on {P} local ranks)")
                run(cfg, env={})
            curves[name] = (levers, *_score(out, model, compute_scale))
        target = max(curves["exact"][1]) - tolerance / 100
        for name, (levers, vals, cum, comm, nbytes) in curves.items():
            reach = next((t for v, t in zip(vals, cum) if v >= target - 1e-12), None)
            results.append(PlanResult(name, levers, max(vals), cum[-1] / len(cum), comm, reach, nbytes))
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return sorted(results, key=lambda r: (r.time_to_target_s is None, r.time_to_target_s or 0.0, r.epoch_s))


def plan_config(base: RunConfig, best: PlanResult, model: ClusterModel) -> str:
    """TOML of ``base`` with the chosen plan's levers (and placement on the hosts)."""
    cfg = _with(base, {**best.levers, **({"partition.hosts": model.hosts} if model.ranks_per_host > 1 else {})},
                **{"runtime.parts": model.world_size})
    data = to_dict(cfg)
    data.get("output", {}).pop("out", None)
    header = (f"# commgnn plan: '{best.name}' for {model.hosts} hosts x {model.ranks_per_host} ranks "
              f"({model.source}); predicted {best.epoch_s:.3f} s/epoch\n")
    return header + dump_toml(data)

