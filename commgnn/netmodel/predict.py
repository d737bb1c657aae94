"""Predict a finished run's epoch time on a cluster model, from what the run recorded.

Inputs, all from the run directory: ``bytes_by_pair`` (``[P, P]`` per traffic class, the
whole run), ``bytes_by_layer`` (how many collectives per epoch carry each class: one per
layer with bytes), the epochs' byte totals (to take set-up traffic out), and each epoch's
busiest-rank compute (``time_busiest_s``). Gradient sync and control traffic are
all-reduces (:meth:`ClusterModel.allreduce_s`): ``grad_sync`` per optimiser step (one an
epoch in full-graph training, ``steps`` in mini-batch training) as many as the strategy
issues (:func:`grad_allreduces_per_step`: torch's PowerSGD hook three, the rank-1 tensors,
P and Q); ``control`` one an epoch (loss and accuracy counts). A full-graph epoch also
holds one barrier (before gradient sync). The meter's all-gather runs after an epoch's
clock stops and is not priced. A mini-batch run's feature fetch is a request-reply round every
step (``fetch_ids``: the count exchange and the ids, two all-to-alls; ``fetch_rows``: one),
and owner-side sampling one round per layer and step (``topology``). A pipelined halo
exchange (``staleness.mode = "pipeline"``) overlaps compute in the epochs that ran stale
(``stale_epoch`` in the epoch log; the first and any exact epoch did not), and is priced so
there. The comparison skips the first epoch (connections
open, caches warm).

What the links do not explain. A run's measured communication time also holds time that
no byte count predicts: waiting inside a collective for peers that arrive later, and each
collective's own software cost. Where ranks share cores (an emulated cluster on one
machine) this can dominate small exchanges (the docs' cost-model results page has an
example). :func:`residual_s` measures it once, on a reference run of the same configuration
on a link with its own calibration (local ranks over loopback, say), as that run's
measured epoch time less its predicted one; ``predict_run(..., overhead_s=residual)`` joins
it to the price on another link.

How it adds (:func:`with_overhead`). The waiting and the transfers are not independent: on
a slow link the ranks sit in transfers, so the cores are free and late peers catch up while
bytes are on the wire. Adding the two (no overlap) bounds the epoch from above; taking the
larger (one hides the other) bounds it from below. The prediction takes the midpoint,
``link + residual - min(hide, residual) / 2``, where ``hide`` is the link's price in excess
of the reference link's price for the same traffic (``predict_run(..., reference=...)``;
without a reference, all of the link's price): only the extra wire time frees the cores
(the model's assumption, tested only through the validation below), and the reference run
itself is then predicted as measured. How close the sum, the maximum and the midpoint
came to emulated runs, and the current model's errors against its validation grids, are on
the docs' cost-model results page (``benchmarks/emulated_grid.py`` and
``benchmarks/results/cost-model/``).
"""

from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path
from typing import Any, Mapping

import torch

from commgnn.netmodel.model import ClusterModel

ALLREDUCE_CALLS = {"grad_sync": 1, "control": 1}
"""All-reduces per step (``grad_sync``, before :func:`grad_allreduces_per_step`) and per
epoch (``control``)."""
BARRIERS_FULLGRAPH = 1
"""Barriers in a full-graph epoch (the wait for the slowest rank before gradient sync)."""
MINIBATCH_ROUNDS = {"fetch_ids": 2, "fetch_rows": 1, "topology": 3}
"""All-to-alls per step (per layer for ``topology``: counts, ids, sampled neighbours)."""


def read_metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir``'s ``metrics.jsonl`` (one per epoch), parsed."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


PIPELINED = ("halo_fwd", "halo_bwd")
"""Classes a pipelined exchange moves in the background."""


def _config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved ``config.toml`` ({} when absent)."""
    path = run_dir / "config.toml"
    return tomllib.loads(path.read_text()) if path.is_file() else {}


def _layers(run_dir: Path) -> int:
    """The run's ``model.layers`` (2 when its config is absent)."""
    return int(_config(run_dir).get("model", {}).get("layers", 2))


def pipelined(run_dir: Path) -> bool:
    """Whether ``run_dir`` ran a pipelined halo exchange."""
    return _config(run_dir).get("comm", {}).get("halo", {}).get("staleness", {}).get("mode", "none") == "pipeline"


def overlapped_classes(row: Mapping[str, Any], is_pipelined: bool) -> tuple[str, ...]:
    """The classes epoch ``row`` exchanged behind compute: a pipelined run's stale epochs
    (``stale_epoch`` in its log; rows written before that flag: epochs after the first with
    background time and no exact epoch forced by the controller)."""
    if not is_pipelined:
        return ()
    if "stale_epoch" in row:
        stale = bool(row["stale_epoch"])
    else:
        stale = (row.get("epoch", 2) > 1 and row["time_busiest_s"].get("overlap", 0.0) > 0
                 and not row.get("exact_by_controller", False))
    return PIPELINED if stale else ()


def grad_allreduces_per_step(grad: Mapping[str, Any], total_steps: int) -> float:
    """Mean all-reduces a gradient sync issues per optimiser step over ``total_steps``,
    for the run's ``[comm.grad]`` table.

    ``powersgd``: torch's hook all-reduces the rank-1 tensors, then P, then Q (3) after
    ``start_iter`` plain steps (1); ``localsgd``: a plain all-reduce for ``start_iter``
    steps, then one model average every ``period``; ``fp16`` (and PowerSGD's ``half``) add
    the prescale's scalar all-reduce (:mod:`commgnn.comm.grad.prescale`, on unless turned
    off). Strategies that all-gather compressed payloads count as one."""
    strategy = grad.get("strategy", "allreduce")
    start = min(max(2, int(grad.get("start_iter", 10))), max(total_steps, 1))
    later = max(total_steps - start, 0)
    prescale = grad.get("prescale", None) is not False
    if strategy == "powersgd":
        per = 3 + (1 if grad.get("half", False) and prescale else 0)
        return (start + per * later) / max(total_steps, 1)
    if strategy == "localsgd":
        return (start + later / max(int(grad.get("period", 4)), 1)) / max(total_steps, 1)
    return 2.0 if strategy == "fp16" and prescale else 1.0


def barriers_per_epoch(rows: list[dict[str, Any]]) -> int:
    """Barriers in one epoch of a run whose epoch log is ``rows``: a full-graph epoch has
    one, a mini-batch epoch (its rows log ``steps``) none."""
    return 0 if rows and rows[0].get("steps") else BARRIERS_FULLGRAPH


def per_epoch_traffic(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """``[P, P]`` bytes per class in one (mean) epoch, and collectives per class per epoch
    (negative: ring all-reduces)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics_rows(run_dir)
    n = len(rows)
    steps = rows[0].get("steps") if rows else None  # mini-batch runs log their steps per epoch
    pairs, calls = {}, {}
    for c, mat in summary["bytes_by_pair"].items():
        B = torch.tensor(mat, dtype=torch.float64)
        total = float(B.sum())
        if total == 0:
            continue
        in_epochs = sum(r["bytes"].get(c, 0) for r in rows)
        pairs[c] = B * (in_epochs / total) / n  # set-up traffic is not an epoch's
        layers = summary["bytes_by_layer"].get(c, {})
        with_bytes = float(sum(1 for k, v in layers.items() if k != "other" and v > 0) or 1)
        if c == "grad_sync":
            per_step = grad_allreduces_per_step(_config(run_dir).get("comm", {}).get("grad", {}), n * (steps or 1))
            calls[c] = -ALLREDUCE_CALLS[c] * per_step * (steps or 1)
        elif c in ALLREDUCE_CALLS:
            calls[c] = -ALLREDUCE_CALLS[c]
        elif steps and c in MINIBATCH_ROUNDS:
            calls[c] = float(steps * MINIBATCH_ROUNDS[c] * (_layers(run_dir) if c == "topology" else 1))
        else:
            calls[c] = with_bytes
    return pairs, calls


OVERLAP = 0.5
"""Share of ``min(link time, residual)`` that the two overlap (0: they add; 1: the larger
hides the smaller). The midpoint of the two bounds; see the module docstring."""


def with_overhead(exposed_s: float, overhead_s: float, overlap: float = OVERLAP, *,
                  overlappable_s: float | None = None) -> float:
    """Seconds of an epoch's communication: ``exposed_s`` priced on the links (after any
    pipelined overlap) and ``overhead_s`` the links do not explain (:func:`residual_s`),
    overlapping by ``overlap * min(overlappable_s, overhead_s)``.

    ``overlappable_s``: the part of ``exposed_s`` that can hide the overhead, by default
    all of it; :func:`predict_run` passes the link's price in excess of the reference
    link's (where the residual was measured), so that the reference run is predicted as
    measured. ``overlap = 0`` gives ``exposed + overhead``, ``1`` with the default gives
    ``max(exposed, overhead)``."""
    if not 0.0 <= overlap <= 1.0:  # NaN too
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    if not overhead_s >= 0:
        raise ValueError(f"overhead_s must be >= 0, got {overhead_s}")
    hide = exposed_s if overlappable_s is None else min(overlappable_s, exposed_s)
    return exposed_s + overhead_s - overlap * min(max(hide, 0.0), overhead_s)


def exposed_s(model: ClusterModel, compute: float, pairs: Mapping[str, torch.Tensor], calls: Mapping[str, float],
              barriers: int, stale: list[tuple[str, ...]]) -> float:
    """Priced communication seconds an epoch does not hide (the mean over epochs whose
    ``stale`` classes ran behind compute)."""
    if not any(stale):
        return model.predict_epoch(compute, pairs, calls, barriers=barriers)["comm"]
    return statistics.mean(model.predict_epoch(compute, pairs, calls, o, barriers=barriers)["epoch"] - compute
                           for o in stale)


def joined_s(model: ClusterModel, compute: float, pairs: Mapping[str, torch.Tensor], calls: Mapping[str, float],
             barriers: int, stale: list[tuple[str, ...]], overhead_s: float, *, overlap: float = OVERLAP,
             reference: ClusterModel | None = None, exposed: float | None = None) -> float:
    """An epoch's communication seconds: :func:`exposed_s` on ``model`` (``exposed``, when the
    caller has it already) joined to ``overhead_s`` by :func:`with_overhead`; with
    ``reference`` (the link the overhead was measured on), only the price in excess of that
    link's price for the same traffic may hide it."""
    if exposed is None:
        exposed = exposed_s(model, compute, pairs, calls, barriers, stale)
    hide = None
    if reference is not None and overhead_s > 0:
        if reference.world_size != model.world_size:
            raise ValueError(f"the reference model has {reference.world_size} ranks; the model {model.world_size}")
        hide = max(exposed - exposed_s(reference, compute, pairs, calls, barriers, stale), 0.0)
    return with_overhead(exposed, overhead_s, overlap, overlappable_s=hide)


def predict_run(run_dir: Path | str, model: ClusterModel, *, overhead_s: float = 0.0,
                overlap: float = OVERLAP, reference: ClusterModel | None = None) -> dict[str, Any]:
    """Measured and predicted seconds per epoch (means over epochs 2..n) for ``run_dir``.

    ``overhead_s``: seconds per epoch the links do not explain, measured on a reference
    run (:func:`residual_s`), combined with the priced link time by :func:`with_overhead`
    (``overlap``) and reported as ``overhead_s``. ``reference``: the model of the link the
    overhead was measured on; then only the link's price in excess of that link's price
    for the same traffic overlaps the overhead (without it, all of the price may)."""
    with_overhead(0.0, overhead_s, overlap)  # validates both
    run_dir = Path(run_dir)
    rows = read_metrics_rows(run_dir)
    if len(rows) < 2:
        raise ValueError(f"{run_dir}: the comparison needs at least 2 epochs")
    P = len(json.loads((run_dir / "summary.json").read_text())["peak_rss_mb_by_rank"])
    if P != model.world_size:
        raise ValueError(f"{run_dir} ran {P} ranks; the model has {model.world_size}")
    pairs, calls = per_epoch_traffic(run_dir)
    later = rows[1:]
    compute = statistics.mean(r["time_busiest_s"]["compute"] + r["time_busiest_s"].get("sample", 0.0) for r in later)
    barriers = barriers_per_epoch(rows)
    pred = model.predict_epoch(compute, pairs, calls, barriers=barriers)
    is_pipelined = pipelined(run_dir)
    stale = [overlapped_classes(r, is_pipelined) for r in later]
    exposed = exposed_s(model, compute, pairs, calls, barriers, stale)
    pred["hidden"] = pred["comm"] - exposed
    pred["epoch"] = compute + joined_s(model, compute, pairs, calls, barriers, stale, overhead_s, overlap=overlap,
                                       reference=reference, exposed=exposed)
    measured = statistics.mean(r["epoch_s"] for r in later)
    comm_measured = statistics.mean(r["time_busiest_s"]["comm"] + r["time_busiest_s"].get("fetch", 0.0)
                                    for r in later)
    return {"measured_epoch_s": measured, "predicted_epoch_s": pred["epoch"], "compute_s": compute,
            "predicted_comm_s": pred["comm"], "measured_comm_s": comm_measured,
            "error": (pred["epoch"] - measured) / measured,
            "predicted_hidden_s": pred["hidden"], "overhead_s": overhead_s,
            "by_class_s": {c: v for c, v in pred.items() if c not in ("compute", "comm", "hidden", "epoch")}}


def residual_s(reference_run: Path | str, reference_model: ClusterModel) -> float:
    """Seconds per epoch that ``reference_model`` does not explain in ``reference_run``: its
    measured epoch time less the predicted one (means over epochs 2..n), at least 0.

    The reference is the same configuration (graph, partition, model, levers, ranks) run on
    a link that ``reference_model`` was calibrated on, typically local ranks over loopback
    with ``commgnn calibrate --parts P``. A model that over-prices the reference link leaves
    no residual rather than a negative one: that error belongs to the reference link."""
    p = predict_run(reference_run, reference_model)
    return max(0.0, p["measured_epoch_s"] - p["predicted_epoch_s"])
