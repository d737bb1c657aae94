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
from typing import Any, Literal, Mapping

from commgnn import planner
from commgnn.cluster.config import flag_value, parse_rate, parse_time, rate_text, time_text
from commgnn.errors import ConfigError, UserError
from commgnn.options import OptionSet, opt
from commgnn.runner.config import RUN_OPTIONS, RunConfig, resolve_config

PLAN_RUN_KEYWORDS = ("dataset", "data_root", "model", "layers", "hidden", "lr", "seed", "epochs")
"""Run options ``commgnn plan`` takes as flags (the planned run's; any other comes from ``--config``)."""


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """What to plan for (the cluster) and how to probe."""

    out: str | None = None
    """TOML file for the chosen plan (required); its ranking goes beside it as ``.json``."""
    hosts: int = 2
    """Hosts of the written cluster model."""
    ranks_per_host: int = 1
    """Ranks per host of the written cluster model."""
    rate_bps: float = 1e9
    """Each host's link rate in bits per second (written cluster model)."""
    delay_s: float = 0.0
    """One-way delay between hosts in seconds (written cluster model)."""
    net: str | None = None
    """A calibrated model (``commgnn calibrate --out``) instead of the rate and delay."""
    tolerance: float = 0.5
    """Accuracy points below exact allowed."""
    probe_epochs: int | Literal["auto"] = 30
    """Epochs per probe, or ``auto``: as long as the exact probe takes to stop improving
    (``probe_patience`` epochs without a better validation accuracy)."""
    probe_patience: int = 20
    """With ``probe_epochs = "auto"``: epochs without improvement that end the exact probe."""
    compute_scale: float | None = None
    """Factor on the probes' compute; None: the exact probe's measured compute alone over
    shared, at most 1, else cores / ranks."""
    probe_net: str | None = None
    """The probes' own link, calibrated (``commgnn calibrate --parts P`` here): what it leaves
    unexplained in each probe joins that plan's priced communication, half overlapping it."""
    min_gain: float = 0.1
    """Choose a plan over exact only if it is predicted at least this fraction sooner to the
    target, and of plans predicted within this fraction of the fastest, the one with the
    cheapest epoch (0: the fastest, always)."""
    shared_cores: bool = False
    """The cluster's hosts share this machine's cores (a ``commgnn cluster`` emulation): no
    epoch is predicted shorter than its probe's own compute."""
    plans: tuple[str, ...] = ()
    """Only these candidate names (exact is always probed); empty: all."""
    workdir: str | None = None
    """Keep the probe runs here (reruns reuse finished probes); None: a temporary folder."""

    def __post_init__(self) -> None:
        if self.tolerance < 0:
            raise ConfigError(f"--tolerance must be >= 0 points, got {self.tolerance}")
        if self.probe_epochs != "auto" and self.probe_epochs < 2:
            raise ConfigError(f"--probe-epochs must be at least 2, got {self.probe_epochs}")
        if self.probe_patience < 1:
            raise ConfigError(f"--probe-patience must be at least 1 epoch, got {self.probe_patience}")


def _probe_epochs(text: str) -> int | str:
    """``30`` -> 30; any other text is left to the config to accept (``auto``) or refuse."""
    try:
        return int(text)
    except ValueError:
        return text


PLAN_OPTIONS = OptionSet("plan", lambda: PlanConfig, (
    opt("hosts", "--hosts"),
    opt("ranks_per_host", "--ranks-per-host"),
    opt("rate_bps", "--rate", "each host's link rate (written cluster model)", parse=flag_value(parse_rate),
        show=rate_text, dest="rate"),
    opt("delay_s", "--delay", "one-way delay between hosts (written cluster model)", parse=flag_value(parse_time),
        show=time_text, dest="delay"),
    opt("probe_epochs", "--probe-epochs", parse=_probe_epochs),
    opt("shared_cores", "--shared-cores", const=True),
))
"""The options of ``commgnn plan`` (:class:`PlanConfig`); the planned run's come from
:data:`~commgnn.runner.config.RUN_OPTIONS` (:data:`PLAN_RUN_KEYWORDS`) and ``--config``."""


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
