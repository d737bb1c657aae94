"""Validate the alpha-beta cost model against runs on the emulated cluster.

For each (hosts, rate): build the cluster (`commgnn cluster`), calibrate it (`commgnn
calibrate`: ping-pong slope and all-to-all factor), train on it (exact full-graph GCN,
2 layers, hidden 64, Coauthor CS, METIS, `--epochs` epochs, no early stop), and predict the
run's epoch time from its recorded per-pair bytes and its busiest rank's measured compute
(`commgnn.netmodel.predict.predict_run`). Error = (predicted - measured) / measured, mean
epoch time over epochs 2..n. Needs root (network namespaces). The 5 ms delay is netem's where
the kernel has it, otherwise the user-space delay line's (`commgnn.cluster.delayline`); the
table says which.

``--entries`` adds lever runs (``ENTRIES``) beside exact, and ``--layers`` the depth.
``--reference loopback`` also trains each entry on P local ranks over loopback and calibrates
loopback (`commgnn calibrate --parts P`): what that model leaves unexplained in the loopback
run (`commgnn.netmodel.predict.residual_s`: waiting in collectives for peers, each
collective's own cost) joins the emulated links' price, in its own columns: added
(no overlap), as the larger of the two (full overlap) and as the library's rule
(`commgnn.netmodel.predict.with_overhead`: half of the smaller of the residual and the
links' price in excess of the loopback's price overlaps).

    sudo python benchmarks/cost_model.py --hosts 2 4 --ranks-per-host 2 --rates 1gbit 100mbit
    sudo python benchmarks/cost_model.py --hosts 4 --rates 1gbit 100mbit --layers 3 \
        --entries exact tf+q4 precompute+tf --reference loopback --tag levers
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from commgnn.cluster.netns import netem_available
from commgnn.netmodel import ClusterModel
from commgnn.netmodel.predict import OVERLAP, predict_run, residual_s
from tables import write_table

ENTRIES: dict[str, list[str]] = {
    "exact": [],
    "tf+q4": ["--transform-first", "--bits", "4"],
    "precompute+tf": ["--precompute", "--transform-first"],
    "powersgd-r1": ["--grad", "powersgd", "--powersgd-rank", "1"],
}
"""The emulated grid's entries (``benchmarks/emulated_grid.py``) and its CS plan's levers."""


def _slug(entry: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in entry)


def run_on_cluster(hosts: int, r: int, rate: str, delay: str | None, job: list[str]) -> None:
    """Run ``commgnn cluster ... -- JOB`` (hosts x r ranks at ``rate``, optional delay); raise on failure.

    On Ctrl-C (which reaches the cluster too, as the terminal's process group) this waits
    for the cluster to tear its namespaces down: ``subprocess.run`` would kill it after a
    quarter of a second, in the middle of its clean-up, and leave them behind."""
    cmd = [sys.executable, "-m", "commgnn", "cluster", "--hosts", str(hosts), "--ranks-per-host", str(r),
           "--rate", rate, *(["--delay", delay] if delay else []), "--", *job]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=60)  # its own clean-up: agents get 15 s, then the namespaces go
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--rates", nargs="+", default=["1gbit", "100mbit", "100mbit+5ms"])
    ap.add_argument("--dataset", default="CS")
    ap.add_argument("--root", default=os.environ.get("COMMGNN_DATA_ROOT", "../shared/datasets"))
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--out", default="runs/bench-cost-model")
    ap.add_argument("--tag", default="", help="suffix of the result file names (e.g. delay)")
    ap.add_argument("--entries", nargs="+", default=["exact"], choices=list(ENTRIES))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reference", choices=["none", "loopback"], default="none",
                    help="loopback: add the residual of each entry's loopback twin to the prediction")
    ns = ap.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    netem = netem_available()
    for hosts in ns.hosts:
        P = hosts * ns.ranks_per_host
        pdir = out / f"{ns.dataset}-parts{P}"  # the dataset in every name: another graph never reuses these
        if not (pdir / "meta.json").is_file():
            subprocess.run(["commgnn", "partition", "--dataset", ns.dataset, "--data-root", ns.root, "--parts", str(P),
                            "--partitioner", "metis", "--out", str(pdir)], check=True, stdout=subprocess.DEVNULL)
        train = ["train", "--dataset", ns.dataset, "--data-root", ns.root, "--partition-dir", str(pdir),
                 "--model", "gcn", "--layers", str(ns.layers), "--hidden", "64", "--epochs", str(ns.epochs),
                 "--patience", "0", "--quiet", "--no-energy"]
        shape = f"{ns.dataset}-L{ns.layers}-e{ns.epochs}"  # in run names: a run of another shape is never reused
        residual: dict[str, tuple[float, float]] = {}
        if ns.reference == "loopback":
            lo_net = out / f"loopback-P{P}-net.json"
            if not lo_net.is_file():
                subprocess.run([sys.executable, "-m", "commgnn", "calibrate", "--parts", str(P), "--out", str(lo_net)],
                               check=True, stdout=subprocess.DEVNULL)
            lo_model = ClusterModel.from_dict(json.loads(lo_net.read_text()))
            for entry in ns.entries:
                twin = out / f"loopback-P{P}-{shape}-{_slug(entry)}-run"
                if not (twin / "summary.json").is_file():
                    subprocess.run(["rm", "-rf", str(twin)], check=True)
                    subprocess.run([sys.executable, "-m", "commgnn", *train, "--parts", str(P), *ENTRIES[entry],
                                    "--out", str(twin)], check=True, stdout=subprocess.DEVNULL)
                residual[entry] = (residual_s(twin, lo_model), predict_run(twin, lo_model)["measured_comm_s"])
        for spec in ns.rates:
            rate, _, delay = spec.partition("+")
            tag = f"h{hosts}-{spec.replace('+', '-')}"
            net = out / f"{tag}-net.json"
            if not net.is_file():
                run_on_cluster(hosts, ns.ranks_per_host, rate, delay or None, ["calibrate", "--out", str(net)])
            model = ClusterModel.from_dict(json.loads(net.read_text()))
            for entry in ns.entries:
                row = {"hosts": hosts, "ranks_per_host": ns.ranks_per_host, "link": spec}
                if len(ns.entries) > 1:
                    row["entry"] = entry
                if delay:
                    row["delay_by"] = "netem" if netem else "delay line"
                run = out / f"{tag}-{shape}-{_slug(entry)}-run"
                if not (run / "summary.json").is_file():
                    subprocess.run(["rm", "-rf", str(run)], check=True)
                    run_on_cluster(hosts, ns.ranks_per_host, rate, delay or None,
                                   [*train, *ENTRIES[entry], "--out", str(run)])
                p = predict_run(run, model)
                row.update({"calibrated_inter_Mbit_s": f"{model.inter.rate_bps / 1e6:.1f}",
                            "inter_alpha_us": f"{model.inter.alpha_s * 1e6:.0f}",
                            "a2a_factor": f"{model.collective_factor:.2f}",
                            "measured_epoch_s": f"{p['measured_epoch_s']:.3f}",
                            "predicted_epoch_s": f"{p['predicted_epoch_s']:.3f}",
                            "error_%": f"{100 * p['error']:+.1f}",
                            "compute_s": f"{p['compute_s']:.3f}",
                            "comm_measured_s": f"{p['measured_comm_s']:.3f}",
                            "comm_predicted_s": f"{p['predicted_comm_s']:.3f}"})
                if entry in residual:
                    r, lo_comm = residual[entry]
                    q = {o: predict_run(run, model, overhead_s=r, overlap=o,
                                        reference=lo_model if o == OVERLAP else None) for o in (0.0, 1.0, OVERLAP)}
                    row.update({"loopback_comm_s": f"{lo_comm:.3f}", "loopback_residual_s": f"{r:.3f}",
                                "error_residual_added_%": f"{100 * q[0.0]['error']:+.1f}",
                                "error_residual_max_%": f"{100 * q[1.0]['error']:+.1f}",
                                "predicted_midpoint_s": f"{q[OVERLAP]['predicted_epoch_s']:.3f}",
                                "error_midpoint_%": f"{100 * q[OVERLAP]['error']:+.1f}"})
                rows.append(row)
                print(rows[-1], flush=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "—") for k in cols} for r in rows]
    stamp = datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "cost-model" / f"{stamp}-cost-model{'-' + ns.tag if ns.tag else ''}"
    write_table(rows, stem, f"Cost model: prediction against emulated-cluster runs ({stamp})", [
        "All emulated hosts share this machine's cores; links shaped with tbf in network namespaces (`commgnn cluster`). "
        f"GCN {ns.layers}x64 on {ns.dataset} ({', '.join(ns.entries)}), METIS, {ns.epochs} epochs; mean over "
        "epochs 2..n. Predicted = busiest rank's measured compute + the calibrated model's price of the run's "
        "recorded per-pair bytes."
        + (" Residual: what the loopback model leaves unexplained in the same entry's run on P local ranks "
           "over loopback (its measured epoch less its predicted one), joined to the links' price as a sum "
           "(added), as the larger of the two (max) or by the library's rule (`with_overhead`: half of the smaller of "
           "the residual and the links' price in excess of the loopback's overlaps)."
           if ns.reference == "loopback" else "")])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
