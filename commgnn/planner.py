"""The planner (below the API, which exposes it as ``commgnn.plan``): rank communication plans by predicted time to accuracy on a cluster.

A plan is a set of levers: halo codecs and staleness, the gradient strategy, and, for
GraphSAGE, mini-batch training. Each candidate is trained for ``probe_epochs`` epochs on
local ranks (as many as the cluster has), which gives its accuracy curve, its per-pair
bytes and its compute per epoch. The cluster model (written: a rate and a delay, or
calibrated: ``commgnn calibrate``) prices each probe's bytes (:mod:`commgnn.netmodel.predict`);
compute is the probe's busiest rank's, times ``compute_scale`` (the probe's ranks share
this machine's cores, a real cluster's hosts do not; by default the scale is measured, one
factor for every plan: the exact probe's busiest rank's compute alone over its compute
shared, ``1 / compute_shared_over_alone`` in its ``summary.json``, at most 1, or cores /
ranks where it was not measured). Compute alone times the exact model's forward and
backward only, so one factor keeps each lever's own compute (codecs, sampling) in its
probe's score. The target is the exact probe's best validation
accuracy less ``tolerance`` points; a plan's score is the predicted time (cumulative
epochs) until its validation accuracy reaches the target, and plans that never reach it
within the probe are ranked after those that do. The best plan is written as a config
that ``commgnn train --config`` accepts.

Probe length matters on graphs that converge slowly: when the exact probe is still
improving at its end, its best is a low target that lossy plans reach early, though they
may plateau below exact later (Computers on 8 ranks at 1 Gbit/s: 30-epoch probes chose
pipelined + 4-bit, which ended 17 points under exact at 100 epochs). ``probe_epochs=None``
("auto") therefore trains the exact probe until its validation accuracy has not improved
for ``probe_patience`` epochs (at most the base run's epochs) and probes every other plan
for as many epochs; with a fixed length, :attr:`PlanResult.still_rising` flags an exact
probe whose best came in its last fifth.

A cheap plan can also climb more slowly than exact per epoch and still reach the target
sooner in time (Computers at 100 Mbit/s: precompute + transform-first has 3.5x shorter
epochs but needs about 1.4x exact's epochs). An auto probe that has not reached the target
when its predicted time is still below ``1 - min_gain`` of the exact probe's predicted time
to the target is therefore probed again, longer (time-bounded, as
``benchmarks/emulated_grid.py``'s ``NAME@E`` entries): for as many epochs as fit in that
time at its predicted epoch time, at most the base run's epochs. The longer probe keeps its
own folder (``<name>-long``), so a rerun reuses both, and a longer one serves a shorter need.

The chosen plan (:func:`choose`) is the first in that order unless it is predicted less than
``min_gain`` (default 10%) sooner than exact: one seed's probe curve cannot tell such plans
apart, and exact risks no accuracy. Of lossy plans predicted within that margin of the first,
the one with the cheapest predicted epoch is chosen, for the same reason.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from commgnn.cluster.config import flag_value, parse_rate, parse_time, rate_text, time_text
from commgnn.config import dump_toml, from_dict, set_path, to_dict
from commgnn.errors import ConfigError, UserError
from commgnn.options import OptionSet, opt
from commgnn.runner.config import RunConfig
from commgnn.netmodel import ClusterModel
from commgnn.netmodel.predict import (barriers_per_epoch, joined_s, overlapped_classes, per_epoch_traffic, pipelined,
                                      read_metrics_rows, residual_s)

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


def run(cfg: RunConfig, env: Mapping[str, str]) -> Any:
    """Train one probe (the runner's local launch; the planner sits below the API)."""
    from commgnn.runner.launching import train_command

    return train_command(cfg, env)


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
    probe_epochs: int = 0
    """Epochs this plan was probed for."""
    still_rising: bool = False
    """This probe's best validation epoch is in its last fifth (it may not have converged)."""
    overhead_s: float = 0.0
    """Seconds per epoch added for what the probe link's model left unexplained (scaled)."""


def _with(base: RunConfig, levers: Mapping[str, Any], **paths: Any) -> RunConfig:
    data = to_dict(base)
    for key, value in {**levers, **paths}.items():
        set_path(data, key, value)
    return from_dict(RunConfig, data)


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def measured_compute_scale(run_dir: Path, P: int) -> float:
    """The exact probe's compute alone over its compute shared, at most 1 (see the module
    docstring); cores / P (at most 1) where it was not measured."""
    ratio = _summary(run_dir).get("compute_shared_over_alone")
    if isinstance(ratio, (int, float)) and ratio > 0:
        return min(1.0, 1.0 / float(ratio))
    return min(1.0, (os.cpu_count() or 1) / P)


def _score(run_dir: Path, model: ClusterModel, compute_scale: float, overhead_s: float = 0.0,
           shared_cores: bool = False, reference: ClusterModel | None = None,
           ) -> tuple[list[float], list[float], float, float, float]:
    """Per-epoch validation accuracies, predicted cumulative seconds (set-up first),
    predicted comm s/epoch, bytes per epoch and the predicted set-up seconds of a probe run;
    ``overhead_s`` joins every epoch's priced communication (``with_overhead``; with the
    probes' link model ``reference``, only the price in excess of that link's hides it);
    ``shared_cores``: no epoch is shorter than the probe's own (see :func:`plan`)."""
    rows = read_metrics_rows(run_dir)
    pairs, calls = per_epoch_traffic(run_dir)
    barriers = barriers_per_epoch(rows)
    comm = model.predict_epoch(0.0, pairs, calls, barriers=barriers)["comm"]
    # set-up (a precomputed aggregation, a filled cache) counts, as in time_to_best_val_s;
    # it is mostly compute here, so it takes the compute scale
    setup = compute_scale * float(_summary(run_dir).get("setup_s", 0.0))
    is_pipelined = pipelined(run_dir)
    t, cum = setup, []
    for r in rows:
        b = r["time_busiest_s"]
        compute = compute_scale * (b["compute"] + b.get("sample", 0.0))
        # a pipelined plan's stale epochs hide their halo exchange behind compute
        stale = [overlapped_classes(r, is_pipelined)]
        epoch = compute + joined_s(model, compute, pairs, calls, barriers, stale, overhead_s, reference=reference)
        if shared_cores:  # all ranks' work on the same cores, as in the probe
            epoch = max(epoch, b["compute"] + b.get("sample", 0.0))
        t += epoch
        cum.append(t)
    return [r["val_acc"] for r in rows], cum, comm, statistics.mean(r["total_bytes"] for r in rows), setup


def still_rising(vals: list[float]) -> bool:
    """Whether a probe's best validation accuracy came in its last fifth (the first best
    counts: a plateau that began earlier is not rising)."""
    best_at = max(range(len(vals)), key=vals.__getitem__)
    return best_at + 1 > 0.8 * len(vals)


def _probed(out: Path, length: Mapping[str, int], parts: int, *, or_longer: bool = False) -> bool:
    """A finished probe in ``out`` with this length on ``parts`` ranks (a workdir may hold
    probes of another length or cluster). ``or_longer``: a fixed-length probe (patience 0)
    with more epochs also serves, since its first epochs are the shorter probe's run (same
    seed, no schedule tied to the length); a re-plan on a faster link, whose re-probes are
    shorter, then reuses the slower link's."""
    try:
        cfg = tomllib.loads((out / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    train = cfg.get("train", {})

    def fits(key: str, want: int) -> bool:
        got = train.get(key.split(".")[1])
        return got == want or (or_longer and key == "train.epochs" and isinstance(got, int) and got > want)

    return ((out / "summary.json").is_file() and cfg.get("runtime", {}).get("parts") == parts
            and all(fits(k, v) for k, v in length.items()))


def _reach(vals: list[float], cum: list[float], target: float) -> float | None:
    """Predicted seconds until the validation accuracy first reaches ``target`` (None: never)."""
    return next((t for v, t in zip(vals, cum) if v >= target - 1e-12), None)


def plan(base: RunConfig, model: ClusterModel, *, tolerance: float,
         probe_epochs: int | None = PlanConfig.probe_epochs,  # type: ignore[assignment]
         probe_patience: int = PlanConfig.probe_patience, compute_scale: float | None = None,
         workdir: Path | None = None,
         names: list[str] | None = None, log: Any = print,
         probe_model: ClusterModel | None = None, min_gain: float = PlanConfig.min_gain,
         shared_cores: bool = False) -> list[PlanResult]:
    """Probe every candidate and rank them (best first). ``probe_epochs=None``: probe as long
    as the exact plan takes to stop improving for ``probe_patience`` epochs; ``probe_model``:
    the probes' own link, calibrated, whose residual in each probe joins its epochs (``with_overhead``);
    ``min_gain``: :func:`choose`'s, which bounds a re-probe to the time that could still win
    (see the module docstring).

    ``shared_cores``: the cluster's hosts share the cores the probes ran on (a cluster
    emulated on this machine, ``commgnn cluster``). Then no epoch is shorter than the
    probe's own busiest-rank compute, unscaled: in a probe every rank computes at once on
    these cores, and on the emulated cluster the same work meets the same cores, whatever
    the link hides. Without it a lever whose codec costs compute is priced as if each host
    had its own cores (the docs' emulated cluster results page shows the error that made)."""
    _check_min_gain(min_gain)
    if probe_epochs is not None and probe_epochs < 2:
        raise UserError(f"probes need at least 2 epochs, got {probe_epochs}")
    if probe_patience < 1:
        raise UserError(f"the probe patience must be at least 1 epoch, got {probe_patience}")
    P = model.world_size
    if probe_model is not None and probe_model.world_size != P:
        raise UserError(f"the probe link's model has {probe_model.world_size} ranks; the cluster has {P} "
                        f"(calibrate the probes' link with --parts {P})")
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
    results, curves, overheads = [], {}, {}
    try:
        epochs = probe_epochs
        target, exact_t = 0.0, None
        for name, levers in grid.items():  # "exact" comes first: auto probes take its length
            out = work / "".join(c if c.isalnum() else "-" for c in name)
            auto = epochs is None
            length = {"train.epochs": base.train.epochs, "train.patience": probe_patience} if auto else \
                {"train.epochs": epochs, "train.patience": 0}
            cfg = _with(base, {**levers, **hosts_flag}, **{"runtime.parts": P, **length, "output.quiet": True,
                                                           "output.out": str(out), "energy.track": False})
            if not _probed(out, length, P):
                shutil.rmtree(out, ignore_errors=True)
                what = (f"until {probe_patience} epochs without improvement, at most {base.train.epochs}" if auto
                        else f"{epochs} epochs")
                log(f"probe: {name} ({what} on {P} local ranks)")
                run(cfg, env={})
            if compute_scale is None:  # one contention factor, the exact probe's, for every plan
                compute_scale = measured_compute_scale(out, P)
                log(f"probe: compute scaled by {compute_scale:.3f} (exact probe's compute alone over shared)")
            scale = compute_scale

            def price(run_dir: Path) -> None:  # this probe's curve, predicted on the cluster
                try:
                    overheads[name] = scale * residual_s(run_dir, probe_model) if probe_model is not None else 0.0
                except ValueError as exc:  # a probe of one epoch has nothing to compare
                    raise UserError(f"--probe-net: cannot price probe {name!r}: {exc}") from None
                curves[name] = (levers, *_score(run_dir, model, scale, overheads[name], shared_cores, probe_model))

            price(out)
            if auto and name == "exact":
                epochs = len(curves[name][1])
                log(f"probe: exact stopped after {epochs} epochs; every other plan is probed for as many")
                target = max(curves["exact"][1]) - tolerance / 100
                exact_t = _reach(curves["exact"][1], curves["exact"][2], target)
                continue
            vals, cum, setup = curves[name][1], curves[name][2], curves[name][5]
            if probe_epochs is None and exact_t is not None and _reach(vals, cum, target) is None:
                per_epoch = (cum[-1] - setup) / len(cum)
                win_t = (1.0 - min_gain) * exact_t  # later than this, choose() keeps exact anyway
                longer = min(base.train.epochs, int((win_t - setup) / per_epoch)) if per_epoch > 0 else 0
                if longer > len(vals):  # it could still win: probe it that long
                    out_long = out.with_name(out.name + "-long")
                    length = {"train.epochs": longer, "train.patience": 0}
                    if not _probed(out_long, length, P, or_longer=True):  # later epochs cannot win
                        shutil.rmtree(out_long, ignore_errors=True)
                        log(f"probe: {name} has not reached the target in {len(vals)} epochs, {cum[-1]:.0f} s "
                            f"predicted, under {1 - min_gain:.0%} of exact's {exact_t:.0f} s: probed again for "
                            f"{longer} epochs")
                        run(_with(cfg, {}, **{**length, "output.out": str(out_long)}), env={})
                    price(out_long)
        target = max(curves["exact"][1]) - tolerance / 100
        for name, (levers, vals, cum, comm, nbytes, setup) in curves.items():
            reach = _reach(vals, cum, target)
            rising = still_rising(vals) and probe_epochs is not None
            results.append(PlanResult(name, levers, max(vals), (cum[-1] - setup) / len(cum), comm, reach, nbytes,
                                      len(vals), rising, overheads[name]))
        if next(r for r in results if r.name == "exact").still_rising:  # the target may be low
            log(f"warning: the exact probe was still improving at epoch {len(curves['exact'][1])} (its best came in "
                f"the last fifth), so the target may be too low for lossy plans; probe longer "
                f"(--probe-epochs auto, or more epochs)")
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return sorted(results, key=lambda r: (r.time_to_target_s is None, r.time_to_target_s or 0.0, r.epoch_s))


def _check_min_gain(min_gain: float) -> None:
    if not 0.0 <= min_gain < 1.0:
        raise UserError(f"the minimum gain over exact (--min-gain) must be a fraction in [0, 1), got {min_gain}")


def choose(ranked: list[PlanResult], min_gain: float = PlanConfig.min_gain) -> PlanResult:
    """The plan to run, from ``ranked`` (:func:`plan`'s order).

    1. Exact, if the leader is predicted less than ``min_gain`` sooner than exact.
    2. Else, of the plans that reach the target and whose predicted time is within the same
       margin of the leader's (the leader's time over ``1 - min_gain`` at most), the one with
       the cheapest predicted epoch.

    Why: a probe is one seed's curve, and the epochs it needs to reach the target vary by tens
    of percent between seeds and between near-lossless plans, while a predicted epoch errs
    where ranks share cores. A lossy plan predicted only marginally sooner is within that
    noise, and exact carries no accuracy risk. Between lossy plans that close, the epoch
    price is the better-measured half of the prediction (the cost model), so the cheaper
    epoch is preferred. The cases that led to both rules are on the docs' emulated cluster
    results page. ``min_gain = 0`` turns both rules off."""
    _check_min_gain(min_gain)
    best = ranked[0]
    exact = next((r for r in ranked if r.name == "exact"), None)
    if best.name == "exact" or best.time_to_target_s is None:
        return best
    if exact is not None and exact.time_to_target_s is not None \
            and best.time_to_target_s > (1.0 - min_gain) * exact.time_to_target_s:
        return exact
    ties = [r for r in ranked if r is best or (r.name != "exact" and r.time_to_target_s is not None
                                               and (1.0 - min_gain) * r.time_to_target_s < best.time_to_target_s)]
    return min(ties, key=lambda r: (r.epoch_s, r.time_to_target_s))


def plan_config(base: RunConfig, best: PlanResult, model: ClusterModel) -> str:
    """TOML of ``base`` with the chosen plan's levers (and placement on the hosts)."""
    cfg = _with(base, {**best.levers, **({"partition.hosts": model.hosts} if model.ranks_per_host > 1 else {})},
                **{"runtime.parts": model.world_size})
    data = to_dict(cfg)
    data.get("output", {}).pop("out", None)
    header = (f"# commgnn plan: '{best.name}' for {model.hosts} hosts x {model.ranks_per_host} ranks "
              f"({model.source}); predicted {best.epoch_s:.3f} s/epoch\n")
    return header + dump_toml(data)

