"""What a loopback twin measures with and without energy measurement (a diagnostic for
``emulated_grid.py``'s twins), beside the same plan on the emulated cluster.

One plan file, four ways, ``--reps`` times each: P local ranks over loopback and 4 emulated
hosts x 2 ranks at ``--rate`` (``commgnn cluster``), each with CodeCarbon on (as every grid
run) and with ``--no-energy`` (as the twins before 2026-12-05 evening). While a run trains,
this script samples ``/proc/stat`` and the run's ``metrics.jsonl`` every 0.1 s, and every
rank logs its generation-2 (full) garbage collections through a ``sitecustomize`` put first
on ``PYTHONPATH`` (``gc.callbacks``; it shadows any other ``sitecustomize`` for these runs).
Written by hand: no library samples a process tree's CPU against a training log.

Per run: the mean epoch over epochs 2..6 and 2..21 (what a 6- and a 21-epoch twin measure),
the median and the longest epoch after the first, machine CPU seconds per epoch (all cores;
user, system, irq, softirq; from the sample that saw epoch 5 logged to the first that saw
epoch n-5) and the full collections from the sample that saw epoch 1 logged to the last
that did not see epoch n (so none from start-up, and none after the epochs).

    sudo python benchmarks/twin_flags.py --config runs/bench-tie/Computers-1gbit-plan.toml \\
        --partition-dir runs/bench-tie/Computers-parts8 --dataset Computers
    python benchmarks/twin_flags.py ... --loopback-only --energy off --compare-flag=--gc-freeze

``--train-flag`` adds a ``commgnn train`` flag to every run. ``--compare-flag F`` runs every
configuration twice in a row, without and with ``F``, so that a flag's effect is not
confounded with drift between batches. (``runtime.gc_freeze`` was on by default for part of
2026-12-05: the tables ``twin-flags-gc-freeze``, ``-gc-freeze-ab`` and ``-ab-no-energy`` of
that day ran with it on unless ``--no-gc-freeze`` is named; the first ``twin-flags`` table
ran before it existed.)
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tables import write_table

SITE = '''import gc, os, time
_t = [0.0]
def _cb(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
    elif info["generation"] == 2:
        with open(os.path.join({logdir!r}, f"gc-{{os.getpid()}}.log"), "a") as f:
            f.write(f"{{time.time():.3f}} {{time.perf_counter() - _t[0]:.4f}}\\n")
gc.callbacks.append(_cb)
'''
STAT = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _stat() -> list[int]:
    with open("/proc/stat") as fh:
        return [int(x) for x in fh.readline().split()[1:len(STAT) + 1]]


def _lines(run: Path) -> int:
    try:
        return len((run / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def sampled(cmd: list[str], run: Path, env: dict[str, str]) -> list[tuple[float, list[int], int]]:
    """Run ``cmd``; (time, /proc/stat jiffies, epochs logged) every 0.1 s until it ends."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    samples: list[tuple[float, list[int], int]] = []
    while proc.poll() is None:
        samples.append((time.time(), _stat(), _lines(run)))
        time.sleep(0.1)
    samples.append((time.time(), _stat(), _lines(run)))
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed ({proc.returncode})")
    return samples


def summarise(run: Path, samples: list[tuple[float, list[int], int]], logdir: Path) -> dict[str, Any]:
    """The row for one run (see the module docstring)."""
    epochs = [json.loads(x)["epoch_s"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    n = len(epochs)
    a = next(s for s in samples if s[2] >= 5)
    b = next(s for s in samples if s[2] >= n - 5)
    hz = os.sysconf("SC_CLK_TCK")
    d = [(y - x) / hz / max(b[2] - a[2], 1) for x, y in zip(a[1], b[1])]
    # collections at start-up and after the last epoch are not the epochs'
    t0 = next(s for s in samples if s[2] >= 1)[0]
    t1 = max(s[0] for s in samples if s[2] < n)
    gcs = []
    for log in logdir.glob("gc-*.log"):
        for line in log.read_text().splitlines():
            at, took = map(float, line.split())
            if t0 <= at <= t1:
                gcs.append(took)
    later = epochs[1:]
    worst = max(range(1, n), key=lambda i: epochs[i])
    return {"epochs 2-6 s": f"{statistics.mean(epochs[1:6]):.3f}",
            "epochs 2-21 s": f"{statistics.mean(epochs[1:21]):.3f}",
            "median s": f"{statistics.median(later):.3f}", "mean s": f"{statistics.mean(later):.3f}",
            "longest s (epoch)": f"{epochs[worst]:.3f} ({worst + 1})",
            "CPU s/epoch": f"{sum(d[STAT.index(k)] for k in ('user', 'nice', 'system', 'softirq', 'irq')):.3f}",
            "of which softirq": f"{d[STAT.index('softirq')]:.3f}",
            "full collections in training": len(gcs),
            "of them over 0.1 s": sum(1 for g in gcs if g > 0.1),
            "longest collection s": f"{max(gcs):.2f}" if gcs else "—"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the plan file (`commgnn train --config`)")
    ap.add_argument("--partition-dir", required=True)
    ap.add_argument("--dataset", default="Computers")
    ap.add_argument("--root", default=os.environ.get("COMMGNN_DATA_ROOT", "../shared/datasets"))
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="runs/twin-flags")
    ap.add_argument("--tag", default="")
    ap.add_argument("--loopback-only", action="store_true", help="leave out the emulated cluster (no root needed)")
    ap.add_argument("--train-flag", action="append", default=[], dest="train_flags",
                    help="an extra `commgnn train` argument for every run (repeatable; "
                         "e.g. --train-flag=--no-gc-freeze)")
    ap.add_argument("--energy", choices=["both", "on", "off"], default="both",
                    help="runs with CodeCarbon on, off, or both (default)")
    ap.add_argument("--compare-flag", dest="compare_flag", default="",
                    help="run each configuration without and then with this `commgnn train` flag")
    ns = ap.parse_args()
    if ns.epochs < 26:
        raise SystemExit(f"--epochs must be at least 26 (the table reads epochs 2-21 and 5..n-5), got {ns.epochs}")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    train = ["train", "--config", ns.config, "--dataset", ns.dataset, "--data-root", ns.root, "--partition-dir",
             ns.partition_dir, "--model", "gcn", "--layers", "3", "--hidden", "64", "--epochs", str(ns.epochs),
             "--patience", "0", "--seed", "0", "--quiet", *ns.train_flags]
    rows: list[dict[str, Any]] = []
    wheres = ("loopback",) if ns.loopback_only else ("loopback", ns.rate)
    compared = ("", ns.compare_flag) if ns.compare_flag else ("",)
    energies = {"both": (True, False), "on": (True,), "off": (False,)}[ns.energy]
    for rep, where, energy, extra in itertools.product(range(ns.reps), wheres, energies, compared):
        run = out / f"{where}-{'energy' if energy else 'no-energy'}{extra.replace('--', '-')}-{rep}"
        shutil.rmtree(run, ignore_errors=True)
        flags = [*train, *([] if energy else ["--no-energy"]), *([extra] if extra else []), "--out", str(run)]
        cmd = [sys.executable, "-m", "commgnn", *flags, "--parts", "8"] if where == "loopback" else \
            [sys.executable, "-m", "commgnn", "cluster", "--hosts", "4", "--ranks-per-host", "2",
             "--rate", ns.rate, "--", *flags]
        site = out / f"{run.name}-gc"  # the sitecustomize and the ranks' collection logs, kept
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITE.format(logdir=str(site.resolve())))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(site.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])}
        samples = sampled(cmd, run, env)
        (site / "samples.json").write_text(json.dumps(samples))
        rows.append({"link": where, "energy": "on" if energy else "off",
                     **({"flag": extra or "—"} if ns.compare_flag else {}), "rep": rep + 1,
                     **summarise(run, samples, site)})
        print(rows[-1], flush=True)
    stamp = datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "cost-model" / f"{stamp}-twin-flags{'-' + ns.tag if ns.tag else ''}"
    write_table(rows, stem, f"Loopback twins with and without energy measurement ({stamp})", [
        f"`python benchmarks/twin_flags.py`: `{ns.config}` on {ns.dataset}, {ns.epochs} epochs, seed 0, on 8 "
        "local ranks over loopback" + ("" if ns.loopback_only else f" and on 4 emulated hosts x 2 ranks at {ns.rate}")
        + {"both": ", CodeCarbon on and off", "on": ", CodeCarbon on", "off": ", CodeCarbon off"}[ns.energy] + (f", each without and then with `{ns.compare_flag}`" if ns.compare_flag else "")
        + f", {ns.reps} times each, one run at a time"
        + (f"; every run with `{' '.join(ns.train_flags)}`" if ns.train_flags else "")
        + ". All ranks share the machine's cores.",
        "Epochs 2-6 / 2-21: the mean a 6- or 21-epoch twin measures. Longest: the longest epoch after the "
        "first. CPU s/epoch: the whole machine's busy CPU seconds (all cores; user, system, irq, softirq) per "
        "epoch over epochs 6..n-5, from /proc/stat. Full collections: generation-2 garbage collections any "
        "process of the run ran in epochs 2..n (gc.callbacks), and the longest of them (wall seconds, shared "
        "cores)."])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
