"""``commgnn.plan`` (``commgnn plan``): probe communication plans, rank them by predicted
time to accuracy on a cluster, write the best as a run config.

    commgnn plan --dataset CS --model gcn --layers 3 --hosts 2 --ranks-per-host 2 \\
        --rate 50mbit [--delay 5ms | --net calibrated.json] --tolerance 0.5 --out plan.toml
    commgnn train --config plan.toml ...

The probing and pricing are :mod:`commgnn.planner`'s (below the API); this module resolves
the request, reads the link models and writes the chosen plan.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from commgnn import planner
from commgnn.cluster.config import parse_rate, parse_time
from commgnn.errors import UserError
from commgnn.planner import PLAN_OPTIONS, PLAN_RUN_KEYWORDS, PlanConfig
from commgnn.runner.config import RUN_OPTIONS, RunConfig, resolve_config

__all__ = ["PLAN_OPTIONS", "PLAN_RUN_KEYWORDS", "PlanConfig", "PlanOutcome", "format_table", "plan"]

@dataclass(frozen=True)
class PlanOutcome:
    """The ranked plans and the one written."""

    ranked: list[Any]
    """:class:`commgnn.planner.PlanResult` of every probed plan, best predicted first."""
    chosen: Any
    """The plan written (:func:`commgnn.planner.choose`)."""
    reason: str | None
    """Why the chosen plan is not the first ranked (None where it is)."""
    out: Path
    """The TOML file written (a ``train --config``); the ranking is beside it as ``.json``."""
    residual: bool = False
    """A probe link model was given: each plan has a residual (``overhead_s``)."""


def _read_model(path: str, flag: str) -> Any:
    from commgnn.netmodel import ClusterModel

    try:
        return ClusterModel.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{flag} {path}: not a calibrated model ({exc})") from None


def plan(out: str | Path | None = None, *, config: RunConfig | str | Path | None = None,
         env: Mapping[str, str] | None = None, log: Any = print, **options: Any) -> PlanOutcome:
    """Probe the candidate plans for the run ``config`` (with run options such as
    ``dataset=``, ``model=``, ``epochs=``) on the cluster the plan options describe
    (``hosts=``, ``ranks_per_host=``, ``rate="50mbit"``, ``delay="5ms"`` or ``net=`` a
    calibrated model; :data:`PLAN_OPTIONS`), rank them and write the chosen one to ``out``."""
    from commgnn.netmodel import ClusterModel

    env = os.environ if env is None else env
    if out is not None:
        options["out"] = str(out)
    for key, read in (("rate", parse_rate), ("delay", parse_time)):
        if isinstance(options.get(key), str):
            options[key] = read(options[key])
    run_given = {k: options.pop(k) for k in list(options) if k in RUN_OPTIONS.by_dest and k not in PLAN_OPTIONS.by_dest}
    PLAN_OPTIONS.unknown(list(options), "plan's and the run's")
    pc: PlanConfig = PLAN_OPTIONS.resolve(None, options, env)
    if not pc.out:
        raise UserError("plan needs out= (--out), the TOML file for the chosen plan")
    path = Path(pc.out)
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: folder {path.parent} does not exist")
    if isinstance(config, RunConfig):
        base = resolve_config(None, run_given, env, start=config)
    else:
        base = resolve_config(str(config) if config else None, run_given, env)
    probe_model = _read_model(pc.probe_net, "--probe-net") if pc.probe_net else None
    if pc.net:
        model = _read_model(pc.net, "--net")
    else:
        if pc.hosts < 1 or pc.ranks_per_host < 1 or pc.hosts * pc.ranks_per_host < 2:
            raise UserError("the cluster needs at least 2 ranks (--hosts x --ranks-per-host)")
        model = ClusterModel.written(pc.hosts, pc.ranks_per_host, pc.rate_bps, delay_s=pc.delay_s)
    workdir = Path(pc.workdir) if pc.workdir else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    ranked = planner.plan(base, model, tolerance=pc.tolerance,
                          probe_epochs=None if pc.probe_epochs == "auto" else pc.probe_epochs,
                          probe_patience=pc.probe_patience, compute_scale=pc.compute_scale, workdir=workdir,
                          names=list(pc.plans) or None, probe_model=probe_model, min_gain=pc.min_gain,
                          shared_cores=pc.shared_cores, log=log)
    best = planner.choose(ranked, pc.min_gain)
    reason = None
    if best is not ranked[0] and best.name == "exact":
        reason = (f"{ranked[0].name} is predicted less than {pc.min_gain:.0%} sooner than exact (--min-gain): "
                  "within the probes' noise, so exact")
    elif best is not ranked[0]:
        reason = (f"{best.name} is predicted within {pc.min_gain:.0%} of {ranked[0].name}'s time to the target "
                  f"(--min-gain), with a cheaper epoch ({best.epoch_s:.3f} s against {ranked[0].epoch_s:.3f} s): "
                  "within the probes' noise, so the cheaper epoch")
    path.write_text(planner.plan_config(base, best, model))
    path.with_suffix(".json").write_text(
        json.dumps([{**r.__dict__, "chosen": r is best} for r in ranked], indent=1) + "\n")
    return PlanOutcome(ranked=ranked, chosen=best, reason=reason, out=path, residual=probe_model is not None)


def format_table(ranked: list[Any], residual: bool = False) -> str:
    """The ranking as ``commgnn plan`` prints it (``residual``: with each plan's residual s)."""
    extra = f" {'residual s':>10s}" if residual else ""
    lines = [f"{'plan':40s} {'best val':>8s} {'s/epoch':>8s} {'comm s':>8s} {'MB/epoch':>9s} {'to target':>10s}{extra}"]
    for r in ranked:
        reach = f"{r.time_to_target_s:.1f} s" if r.time_to_target_s is not None else "not reached"
        extra = f" {r.overhead_s:10.3f}" if residual else ""
        lines.append(f"{r.name:40s} {r.best_val:8.4f} {r.epoch_s:8.3f} {r.comm_s:8.3f} "
                     f"{r.bytes_per_epoch / 1e6:9.2f} {reach:>10s}{extra}")
    return "\n".join(lines)
