"""Time to accuracy on an emulated multi-host cluster (issue #14's benchmark grid).

Each entry trains on ``commgnn cluster`` (network namespaces, tbf-shaped veth links,
torchrun per host, gloo over the links), so every byte crosses a shaped link and every
second is measured wall time. Per dataset, link and seed it runs:

- ``exact``: full-graph GCN, exact halo exchange, all-reduce gradients;
- the best halo levers of ``halo-levers-cs.md`` (transform-first + 4-bit rows: 147x fewer
  halo bytes, and the only combination that reached exact's best validation accuracy on
  all 3 seeds there);
- the best gradient strategy of ``grad-sync-long-cs.md`` (PowerSGD rank 1);
- their combination;
- the plan ``commgnn plan`` picked for this link from its probes (calibrated link model);
- ``precompute+tf`` on request: the lossless GCN levers (the first layer's aggregation
  precomputed once, transform-first after it), the plan the CS delay grid's planner chose
  less its 4-bit rows.

Measures per run: the cumulative training time (the slowest rank's epoch seconds, which
include evaluation) until validation accuracy first reaches the same seed's exact run's best
validation accuracy (and that less 0.5 points, the plan's tolerance); bytes per epoch; the
busiest rank's time split; energy. All emulated hosts share this machine's 2 cores, so compute
is slower than on a real cluster by about ranks / cores; the comparison between entries is fair
(same machine, same protocol), the absolute times are not a real cluster's.

An entry written ``NAME@E`` (e.g. ``plan@100``) trains NAME for E epochs instead of the
grid's: a time-bounded protocol for entries whose epochs are cheap, so that one that has not
reached the target when exact's epoch count runs out is not scored as "never" for being cut
short. The target stays the exact run's best over the grid's epochs; exact's own time to it
is unchanged, so E below exact's wall time / the entry's epoch time changes no ratio's meaning.

    sudo python benchmarks/emulated_grid.py --datasets CS --links 100mbit 1gbit 100mbit+5ms --seeds 0 1 2
    python benchmarks/emulated_grid.py --report-only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from commgnn.netmodel import ClusterModel
from commgnn.netmodel.predict import predict_run, read_metrics_rows, residual_s
from cost_model import run_on_cluster
from tables import time_to, write_table

ENTRIES: dict[str, list[str]] = {
    "exact": [],
    "tf+q4": ["--transform-first", "--bits", "4"],
    "powersgd-r1": ["--grad", "powersgd", "--powersgd-rank", "1"],
    "tf+q4+powersgd-r1": ["--transform-first", "--bits", "4", "--grad", "powersgd", "--powersgd-rank", "1"],
    "precompute+tf": ["--precompute", "--transform-first"],
    "precompute+tf+q4": ["--precompute", "--transform-first", "--bits", "4"],
    "plan": [],
}
OPT_IN = ("precompute+tf", "precompute+tf+q4")
"""Entries run only when ``--entries`` names them (the grid's default is the rest)."""
TOLERANCE = 0.5


def _entry(spec: str, epochs: int) -> tuple[str, int]:
    """``plan@100`` -> ("plan", 100): an entry trained for more epochs than the grid's (a
    time-bounded protocol for cheap entries: the target stays the exact run's best)."""
    name, _, e = spec.partition("@")
    if name not in ENTRIES or (e and not e.isdigit()):
        raise SystemExit(f"unknown entry {spec!r}: one of {', '.join(ENTRIES)}, optionally @EPOCHS")
    return name, int(e) if e else epochs


def _link(spec: str) -> tuple[str, str | None]:
    """``100mbit+5ms`` -> (rate, one-way delay); the delay is None when the spec has none."""
    rate, _, delay = spec.partition("+")
    return rate, delay or None


def _cluster_compute_scale(out: Path, ds: str, link: str, probes: Path) -> float:
    """The exact run's compute on this cluster over the exact probe's on local ranks: the
    factor that turns a probe's measured compute into the cluster's (mean over the grid's
    finished exact runs of this dataset and link; busiest rank, seconds per epoch)."""
    runs = sorted((out / ds / link / "exact").glob("s*/summary.json"))
    if not runs:
        raise SystemExit(f"--plan-compute-scale cluster needs an exact run on {ds} {link} first (list exact first)")
    on_cluster = statistics.mean(json.loads(r.read_text())["time_split"]["compute"] for r in runs)
    probe = json.loads((probes / "exact" / "summary.json").read_text())["time_split"]["compute"]
    return on_cluster / probe


def _loopback_net(ns: argparse.Namespace, out: Path) -> Path:
    """The loopback link of P local ranks, calibrated once (``commgnn calibrate``): the
    probes' link for ``--probe-net``, and the twins' for ``--residual``."""
    P = ns.hosts * ns.ranks_per_host
    lo = out / f"loopback-parts{P}-net.json"
    if not lo.is_file():
        subprocess.run([sys.executable, "-m", "commgnn", "calibrate", "--parts", str(P), "--out", str(lo)],
                       check=True, stdout=subprocess.DEVNULL)
    return lo


def _plan(ns: argparse.Namespace, out: Path, ds: str, link: str, net: Path) -> Path:
    """The plan ``commgnn plan`` picks for this link: probes on P local ranks, priced on the
    link calibrated inside the emulated cluster (``net``); with ``--probe-net`` the loopback
    is calibrated too and what it leaves unexplained in each probe joins that plan's price.

    Compute: the emulated hosts share this machine's cores, but not as the probes' local
    ranks do (over loopback the transfers themselves take the cores; behind a slow link the
    ranks mostly wait). ``--plan-compute-scale cluster`` (the default) therefore scales the
    probes' compute by the exact run's compute on this cluster over the exact probe's
    (:func:`_cluster_compute_scale`; the exact probe runs first, alone, if it has not). The
    planner's own default (``probe``: compute alone over shared) prices hosts with their own
    cores, which this grid does not run on. ``--shared-cores`` (plans made from 2026-12-04's
    100 Mbit/s + 5 ms grid on) keeps every predicted epoch at least its probe's own compute,
    since the emulated hosts share the cores the probes ran on; the scale alone priced a
    codec's compute as if each host had its own."""
    plan = out / f"{ds}-{link}-plan.toml"
    if not plan.is_file():
        P = ns.hosts * ns.ranks_per_host
        probes = out / f"{ds}-probes-P{P}"
        extra: list[str] = []
        if ns.probe_net:
            extra = ["--probe-net", str(_loopback_net(ns, out))]
        cmd = ["commgnn", "plan", "--dataset", ds, "--data-root", ns.root, "--model", "gcn", "--layers",
               str(ns.layers), "--hidden", str(ns.hidden), "--epochs", str(ns.plan_epochs or ns.epochs),
               "--hosts", str(ns.hosts), "--ranks-per-host", str(ns.ranks_per_host), "--net", str(net),
               "--tolerance", str(TOLERANCE), "--probe-epochs", str(ns.probe_epochs), "--shared-cores", *extra,
               "--workdir", str(probes)]
        scale: float | None = None
        if ns.plan_compute_scale == "cluster":
            if not (probes / "exact" / "summary.json").is_file():  # the exact probe alone
                probes.mkdir(parents=True, exist_ok=True)  # `commgnn plan --out` wants its folder
                subprocess.run([*cmd, "--plans", "exact", "--out", str(probes / "exact-only.toml")], check=True)
            scale = _cluster_compute_scale(out, ds, link, probes)
        elif ns.plan_compute_scale != "probe":
            scale = float(ns.plan_compute_scale)
        if scale is not None:
            cmd += ["--compute-scale", f"{scale:.4f}"]
            print(f"{ds} {link}: planning with compute scale {scale:.4f} ({ns.plan_compute_scale})", flush=True)
        subprocess.run([*cmd, "--out", str(plan)], check=True)
        (out / f"{ds}-{link}-plan-scale.json").write_text(json.dumps(
            {"compute_scale": scale, "source": ns.plan_compute_scale}) + "\n")
    return plan


TWIN_EPOCHS = 21
"""Epochs of a loopback twin (``--residual``): the first is left out, as in every comparison.

A twin runs the grid run's own flags, energy measurement included. Twins trained with
``--no-energy`` (before 2026-12-05 evening; ``--legacy-twins`` reads them) were not the runs
they stood for. On 8 local ranks sharing 2 cores without CodeCarbon, every rank ran a full
(generation-2) garbage collection at the same epoch (epoch 9 on Computers, seed 0; the CS
twins' one long epoch, epoch 7, is presumably the same, not logged). The 8 collections ran
at once on the shared cores, up to 0.84 s each, and that epoch took 1.16-1.24 s against a
median of 0.16 s. With energy measurement on, no rank ran one during training, and neither
did the ranks on the emulated cluster, with or without it (``benchmarks/twin_flags.py``:
``gc.callbacks`` logs beside ``/proc/stat``,
``benchmarks/results/cost-model/2026-12-05-twin-flags.md``). With energy on, the Computers 1 Gbit/s
plan's loopback runs left 0.038-0.044 s an epoch unexplained over their first 6, 21 and 60
epochs alike (two 60-epoch runs). 21 epochs also spread CodeCarbon's start-up probe, in the
first epochs, over a mean of 20. ``runtime.gc_freeze`` (off by default, added after these
twins) also keeps a local rank from collecting during training without energy
(``benchmarks/results/cost-model/2026-12-05-twin-flags-gc-freeze*.md``); twins still run their runs'
flags."""


def twin_dir(out: Path, ds: str, link: str, base: str, P: int, layers: int, hidden: int,
             epochs: int = TWIN_EPOCHS, *, legacy: bool = False) -> Path:
    """Where entry ``base``'s loopback twin of ``epochs`` epochs lives (a plan's twin: the
    plan that link chose); ``legacy``: a twin trained without energy measurement (see
    :data:`TWIN_EPOCHS`)."""
    slug = f"plan-{link.replace('+', '-')}" if base == "plan" else re.sub(r"[^A-Za-z0-9]+", "-", base)
    return out / f"loopback-P{P}-{ds}-L{layers}x{hidden}-e{epochs}-{slug}-{'twin' if legacy else 'energy-twin'}"


def _residual(ns: argparse.Namespace, out: Path, ds: str, link: str, name: str, lo_model: ClusterModel) -> float:
    """Seconds per epoch the calibrated links leave unexplained for this entry's
    configuration: its loopback twin (the run's flags on P local ranks, ``--twin-epochs`` epochs,
    trained once and kept) measured less predicted (:func:`commgnn.netmodel.predict.residual_s`),
    as ``benchmarks/cost_model.py --reference loopback`` validates it. A plan's twin runs
    the plan file that link chose."""
    P = ns.hosts * ns.ranks_per_host
    base, _ = _entry(name, ns.epochs)
    extra = ["--config", str(out / f"{ds}-{link}-plan.toml")] if base == "plan" else ENTRIES[base]
    twin = twin_dir(out, ds, link, base, P, ns.layers, ns.hidden, ns.twin_epochs, legacy=ns.legacy_twins)
    if not (twin / "summary.json").is_file():
        if ns.legacy_twins:
            raise SystemExit(f"{twin}: no such legacy twin (--legacy-twins reads twins, it does not train them)")
        subprocess.run(["rm", "-rf", str(twin)], check=True)
        subprocess.run([sys.executable, "-m", "commgnn", "train", *extra, "--dataset", ds, "--data-root", ns.root,
                        "--partition-dir", str(out / f"{ds}-parts{P}"), "--parts", str(P), "--model", "gcn",
                        "--layers", str(ns.layers), "--hidden", str(ns.hidden), "--epochs", str(ns.twin_epochs),
                        "--patience", "0",
                        "--seed", "0", "--quiet", "--out", str(twin)], check=True,
                       stdout=subprocess.DEVNULL)
    return residual_s(twin, lo_model)


def run_grid(ns: argparse.Namespace, out: Path) -> None:
    P = ns.hosts * ns.ranks_per_host
    for ds in ns.datasets:
        pdir = out / f"{ds}-parts{P}"
        if not (pdir / "meta.json").is_file():
            subprocess.run(["commgnn", "partition", "--dataset", ds, "--data-root", ns.root, "--parts", str(P),
                            "--partitioner", "metis", "--out", str(pdir)], check=True, stdout=subprocess.DEVNULL)
        for seed in ns.seeds:
            for link in ns.links:
                net = out / f"{ds}-{link}-net.json"
                if not net.is_file():
                    run_on_cluster(ns.hosts, ns.ranks_per_host, *_link(link), ["calibrate", "--out", str(net)])
                for name in ns.entries:
                    if seed not in ns.entry_seeds.get(name, ns.seeds):
                        continue
                    run = out / ds / link / name / f"s{seed}"
                    if (run / "summary.json").is_file():
                        continue
                    subprocess.run(["rm", "-rf", str(run)], check=True)
                    run.parent.mkdir(parents=True, exist_ok=True)
                    base, epochs = _entry(name, ns.epochs)
                    extra = ENTRIES[base]
                    if base == "plan":
                        extra = ["--config", str(_plan(ns, out, ds, link, net))]
                    job = ["train", *extra, "--dataset", ds, "--data-root", ns.root, "--partition-dir", str(pdir),
                           "--model", "gcn", "--layers", str(ns.layers), "--hidden", str(ns.hidden),
                           "--epochs", str(epochs), "--patience", "0", "--seed", str(seed), "--quiet",
                           "--out", str(run)]
                    t0 = time.perf_counter()
                    run_on_cluster(ns.hosts, ns.ranks_per_host, *_link(link), job)
                    print(f"{ds} {link} {name} s{seed}: {time.perf_counter() - t0:.0f} s", flush=True)


def _fmt(xs: list[float], nd: int = 1) -> str:
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.{nd}f}"
    return f"{statistics.mean(xs):.{nd}f} ± {statistics.stdev(xs):.{nd}f}"


def report(ns: argparse.Namespace, out: Path) -> None:
    rows = []
    lo_model = ClusterModel.from_dict(json.loads(_loopback_net(ns, out).read_text())) if ns.residual else None
    for ds in ns.datasets:
        for link in ns.links:
            exact: dict[int, list[dict[str, Any]]] = {}
            exact_setup: dict[int, float] = {}
            for s in ns.seeds:
                p = out / ds / link / "exact" / f"s{s}"
                if (p / "summary.json").is_file():
                    exact[s] = read_metrics_rows(p)
                    exact_setup[s] = json.loads((p / "summary.json").read_text()).get("setup_s", 0.0)
            t_exact = {s: time_to(r, max(x["val_acc"] for x in r), exact_setup[s]) for s, r in exact.items()}
            for name in ns.entries:
                runs = {s: out / ds / link / name / f"s{s}" for s in exact}
                runs = {s: p for s, p in runs.items() if (p / "summary.json").is_file()}
                if not runs:
                    continue
                t_best, t_tol, speed, speed_tol, accs, mb, epoch, split, kwh, net_share = [], [], [], [], [], [], [], [], [], []
                setup_mb: list[float] = []
                setup_s: list[float] = []
                reached = reached_tol = 0
                for s, p in runs.items():
                    r, summ = read_metrics_rows(p), json.loads((p / "summary.json").read_text())
                    best = max(x["val_acc"] for x in exact[s])
                    setup = summ.get("setup_s", 0.0)
                    a, b = time_to(r, best, setup), time_to(r, best - TOLERANCE / 100, setup)
                    b_exact = time_to(exact[s], best - TOLERANCE / 100, exact_setup[s])
                    setup_mb.append(sum(summ.get("setup_bytes", {}).values()) / 1e6)
                    setup_s.append(setup)
                    if a is not None:
                        reached += 1
                        t_best.append(a)
                        speed.append(t_exact[s] / a)
                    if b is not None:
                        reached_tol += 1
                        t_tol.append(b)
                        speed_tol.append(b_exact / b)
                    accs.append(100 * summ["test_acc"])
                    mb.append((summ["halo_bytes_per_epoch"] + summ["grad_bytes_per_epoch"]
                               + summ.get("eval_halo_bytes_per_epoch", 0.0)) / 1e6)
                    epoch.append(summ["epoch_time_s"])
                    split.append(summ["time_split"])
                    if summ.get("energy_kwh") is not None:
                        kwh.append(1000 * summ["energy_kwh"])
                        net_share.append(100 * summ["energy"].get("network_share", 0.0))
                n = len(runs)
                net = out / f"{ds}-{link}-net.json"
                model = ClusterModel.from_dict(json.loads(net.read_text())) if net.is_file() else None
                preds = [predict_run(p, model) for p in runs.values()] if model is not None else []
                res = _residual(ns, out, ds, link, name, lo_model) if lo_model is not None and model else None
                preds_res = [predict_run(p, model, overhead_s=res, reference=lo_model)
                             for p in runs.values()] if res is not None else []
                sp = {k: statistics.mean(x[k] for x in split) for k in ("compute", "comm", "idle")}
                plan_name = ""
                if name.partition("@")[0] == "plan":
                    pt = out / f"{ds}-{link}-plan.toml"
                    m = re.search(r"# commgnn plan: '([^']*)'", pt.read_text()) if pt.is_file() else None
                    plan_name = m.group(1) if m else ""
                rows.append({
                    "dataset": ds, "link": link, "entry": name + (f" ({plan_name})" if plan_name else ""),
                    "seeds": n, "test acc": _fmt(accs, 2), "MB/epoch (train+eval)": _fmt(mb, 1),
                    "set-up MB": _fmt(setup_mb, 1), "set-up s": _fmt(setup_s, 1),
                    "epoch s": _fmt(epoch, 2),
                    "model epoch s (error)": (f"{_fmt([q['predicted_epoch_s'] for q in preds], 2)} "
                                              f"({statistics.mean(100 * q['error'] for q in preds):+.1f}%)")
                    if preds else "—",
                    **({"model + loopback residual epoch s (error)":
                        f"{_fmt([q['predicted_epoch_s'] for q in preds_res], 2)} "
                        f"({statistics.mean(100 * q['error'] for q in preds_res):+.1f}%; residual {res:.2f})"
                        if preds_res else "—"} if ns.residual else {}),
                    "split compute/comm/idle s": f"{sp['compute']:.2f} / {sp['comm']:.2f} / {sp['idle']:.2f}",
                    "s to exact best val": f"{_fmt(t_best, 0)} ({reached}/{n})",
                    "speed-up": f"{_fmt(speed, 2)}x" if speed else "—",
                    f"s to best - {TOLERANCE}": f"{_fmt(t_tol, 0)} ({reached_tol}/{n})",
                    f"speed-up (-{TOLERANCE})": f"{_fmt(speed_tol, 2)}x" if speed_tol else "—",
                    "energy Wh": _fmt(kwh, 2), "network share %": _fmt(net_share, 0)})
    stamp = ns.stamp or datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "cluster" / f"{stamp}-emulated-grid{'-' + ns.tag if ns.tag else ''}"
    write_table(rows, stem, f"Time to accuracy on an emulated cluster ({stamp})", [
        f"`python benchmarks/emulated_grid.py` (root): {ns.hosts} emulated hosts x "
        f"{ns.ranks_per_host} ranks in network namespaces, links shaped with tbf (`commgnn cluster`), gloo over the "
        f"links. GCN {ns.layers}x{ns.hidden}, dropout 0.5, Adam lr 0.01, METIS, {ns.epochs} epochs, no early "
        "stop, validation every epoch. All hosts share the machine's 2 cores.",
        "Time = the run's set-up (`setup_s`: building the trainer after the partition is loaded, with one-time "
        "exchanges such as precompute's input rows, whose bytes are 'set-up MB') plus the slowest rank's epoch seconds (training + evaluation), "
        "summed until the validation accuracy first reaches the same seed's exact run's best (or that less 0.5 points); speed-up = exact's time to that "
        "accuracy / the entry's, per seed, then averaged. (k/n) = seeds that reached it within the epochs.",
        "Model epoch s: the cost model's prediction from the run's recorded per-pair bytes and its busiest rank's "
        "measured compute, with the link calibrated on the same emulated cluster (`commgnn calibrate`); error = "
        "(predicted - measured) / measured, mean over seeds."
        + (" Model + loopback residual: the library's whole prediction, as `benchmarks/cost_model.py --reference "
           "loopback` validates it: the seconds per epoch the calibrated loopback leaves unexplained in the entry's "
           f"loopback twin (the same configuration on {ns.hosts * ns.ranks_per_host} local ranks, {ns.twin_epochs} "
           f"epochs, seed 0, {'without' if ns.legacy_twins else 'with'} energy measurement), joined to the links' "
           "price by `commgnn.netmodel.predict.with_overhead`."
           if ns.residual else ""),
        "MB/epoch counts every payload handed to a collective (halo forward, backward, evaluation, gradients). "
        "Energy: CodeCarbon offline (CPU + RAM, all ranks) plus network bytes x 2.34e-5 J/byte.", *ns.note])
    print(stem.with_suffix(".md").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["CS"])
    ap.add_argument("--links", nargs="+", default=["100mbit", "1gbit"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--entries", nargs="+", default=[e for e in ENTRIES if e not in OPT_IN],
                    help=f"of {', '.join(ENTRIES)}; NAME@E trains NAME for E epochs instead of --epochs")
    ap.add_argument("--one-seed", nargs="*", default=[],
                    help="entries run with the first seed only (for lack of machine time; the table says so)")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--probe-epochs", default="30", help="epochs per plan probe, or 'auto' (`commgnn plan`)")
    ap.add_argument("--plan-epochs", type=int, default=0,
                    help="the planned run's epochs, which cap an auto probe (default: --epochs)")
    ap.add_argument("--plan-compute-scale", default="cluster",
                    help="`commgnn plan --compute-scale`: 'cluster' (default: exact's compute on this cluster over "
                         "the exact probe's), 'probe' (the planner's default: compute alone) or a number")
    ap.add_argument("--probe-net", action="store_true",
                    help="calibrate the loopback too and pass it to `commgnn plan --probe-net`")
    ap.add_argument("--root", default=os.environ.get("COMMGNN_DATA_ROOT", "../shared/datasets"))
    ap.add_argument("--out", default="runs/bench-emulated")
    ap.add_argument("--stamp", help="date in the result file names (default: today)")
    ap.add_argument("--tag", default="", help="suffix of the result file names (e.g. the dataset)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--residual", action="store_true",
                    help="also report the model with each entry's loopback residual (trains a short loopback twin "
                         "per configuration, once: run it with nothing else on the machine)")
    ap.add_argument("--note", action="append", default=[], help="a note on this run for the table")
    ap.add_argument("--twin-epochs", dest="twin_epochs", type=int, default=TWIN_EPOCHS,
                    help=f"epochs of each loopback twin (--residual; default {TWIN_EPOCHS}, the first left out)")
    ap.add_argument("--legacy-twins", dest="legacy_twins", action="store_true",
                    help="read the twins trained without energy measurement (before 2026-12-05 evening) instead")
    ns = ap.parse_args()
    for e in [*ns.entries, *ns.one_seed]:
        _entry(e, ns.epochs)
    if ns.plan_compute_scale not in ("cluster", "probe"):
        try:
            float(ns.plan_compute_scale)
        except ValueError:
            raise SystemExit(f"--plan-compute-scale: 'cluster', 'probe' or a number, got {ns.plan_compute_scale!r}")
    if ns.probe_epochs != "auto" and not ns.probe_epochs.isdigit():
        raise SystemExit(f"--probe-epochs: a number or 'auto', got {ns.probe_epochs!r}")
    ns.entry_seeds = {e: ns.seeds[:1] for e in ns.one_seed}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if not ns.report_only:
        run_grid(ns, out)
    report(ns, out)


if __name__ == "__main__":
    sys.exit(main())
