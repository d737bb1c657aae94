"""Uneven hosts and stragglers on the emulated cluster: who computes, who waits (issue #57).

One full-graph GraphSAGE job (the default synthetic graph, 2 layers, equal partitions) on
``commgnn cluster --hosts 2``, once per setting, alone on this machine:

- ``equal``: both hosts at ``--host-cpus 0.9,0.9``;
- ``uneven``: ``--host-cpus 1.5,0.3``, host 1 five times slower;
- ``straggler``: equal shares, host 1 stopped 1 s every 4 s (``--straggle 1:every=4s:for=1s``);
- ``slow-link``: equal shares, host 1 behind 20 Mbit/s (``--host-rate 1gbit,20mbit``).

For each, the run's ``summary.json`` gives every rank's seconds of compute, communication
and waiting summed over the epochs (``time_by_rank_s``) and the median epoch. Waiting
(``wait``) is the time a rank blocks for a rank that is late: before each halo exchange
(``--split-wait``: one barrier before it) and before the gradient sync; ``comm`` is the
transfers alone. Equal shares of work are what
commgnn gives every rank today, so this is the baseline that speed-proportional shares
(issue #57's balance) are to drive down.

    sudo python benchmarks/hetero_cluster.py [--epochs 10] [--settings equal uneven ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "hetero"
SETTINGS = {
    "equal": ["--host-cpus", "0.9,0.9"],
    "uneven": ["--host-cpus", "1.5,0.3"],
    "straggler": ["--host-cpus", "0.9,0.9", "--straggle", "1:every=4s:for=1s"],
    "slow-link": ["--host-cpus", "0.9,0.9", "--host-rate", "1gbit,20mbit"],
}


def run(setting: str, epochs: int, work: Path) -> dict[str, Any]:
    out = work / setting
    cmd = [sys.executable, "-m", "commgnn", "cluster", "--hosts", "2", "--rate", "1gbit", *SETTINGS[setting], "--",
           "train", "--model", "sage", "--layers", "2", "--hidden", "64", "--epochs", str(epochs),
           "--patience", "0", "--no-energy", "--quiet", "--no-compute-alone", "--heartbeat-s", "20", "--split-wait",
           "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    row: dict[str, Any] = {"setting": setting, "flags": " ".join(SETTINGS[setting]), "rc": res.returncode}
    if res.returncode != 0:
        row["error"] = (res.stderr.strip().splitlines() or ["?"])[-1][:200]
        return row
    s = json.loads((out / "summary.json").read_text())
    t = s["time_by_rank_s"]
    row.update({"epoch_s": round(s["epoch_time_s"], 3), "test_acc": round(s["test_acc"], 4)})
    for q in range(2):
        for k in ("compute", "comm", "wait"):
            row[f"r{q}_{k}_s"] = round(t[k][q], 2)
    row["wait_share_of_rank_time"] = round(sum(t["wait"]) / max(1e-9, sum(t["epoch"])), 3)
    return row


def write(rows: list[dict[str, Any]], epochs: int) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{datetime.date.today()}-hetero"
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(stem.with_suffix(".csv"), "w") as fh:
        fh.write(",".join(keys) + "\n")
        fh.writelines(",".join(str(r.get(k, "")) for k in keys) + "\n" for r in rows)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    lines = [f"# Uneven hosts and stragglers: who computes, who waits ({datetime.date.today()})", "",
             f"Machine: {cpu or platform.processor()}, {os.cpu_count()} cores. 2 emulated hosts x 1 rank, 1 Gbit/s "
             f"links unless the setting says otherwise; full-graph GraphSAGE 2 x 64 on the default synthetic graph "
             f"(20,000 nodes), {epochs} epochs, equal partitions. r0/r1: each rank's seconds summed over the epochs "
             "(summary.json's time_by_rank_s); epoch_s: the median epoch of the slowest rank.", "",
             "Command: `python benchmarks/hetero_cluster.py " + f"--epochs {epochs}`", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem.with_suffix(".md")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ns = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="commgnn-hetero-"))
    try:
        rows = []
        for setting in ns.settings:
            rows.append(run(setting, ns.epochs, work))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {write(rows, ns.epochs)}")


if __name__ == "__main__":
    main()
