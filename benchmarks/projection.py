"""Project exact and lever epochs to 8 and 32 hosts at 1, 10 and 25 Gbit/s (a model, not a run).

Reference: one exact full-graph GCN run (2 layers, hidden 64, METIS) on 4 local ranks for a
few epochs gives each rank's compute alone (``compute_alone_s``: forward and backward with
the machine to itself). Each target (hosts, rate) gets a METIS partition into ``hosts``
parts (one rank per host, each host with its own cores) and a written cluster model
(``ClusterModel.written``: the NIC rate, 30 us latency); ``commgnn.netmodel.project``
prices an epoch of each lever set. Speed-up = exact's projected epoch / the lever's.

    python benchmarks/projection.py --datasets CS Computers
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from pathlib import Path

from commgnn.data import load_dataset
from commgnn.data.config import DataConfig
from commgnn.netmodel import ClusterModel
from commgnn.netmodel.project import Levers, project_epoch, work
from commgnn.partition import assign_parts
from commgnn.partition.config import PartitionConfig
from tables import write_table


def powersgd_ratio(F: int, h: int, C: int, rank: int = 1, layers: int = 2) -> float:
    """Bytes of rank-r PowerSGD over fp32, for an L-layer GCN's weights (biases uncompressed)."""
    mats = [(F, h)] + [(h, h)] * (layers - 2) + [(h, C)]
    biases = h * (layers - 1) + C
    full = sum(a * b for a, b in mats) + biases
    return (sum(rank * (a + b) for a, b in mats) + biases) / full


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["CS", "Computers"])
    ap.add_argument("--root", default=os.environ.get("COMMGNN_DATA_ROOT", "../shared/datasets"))
    ap.add_argument("--hosts", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--rates-gbit", nargs="+", type=float, default=[1.0, 10.0, 25.0])
    ap.add_argument("--out", default="runs/bench-projection")
    ap.add_argument("--note", action="append", default=[], help="a note on this run for the table")
    ap.add_argument("--layers", type=int, default=2, help="GCN layers (3: the emulated grid's model)")
    ap.add_argument("--stamp", help="name of the result files (default: DATE-projection)")
    ns = ap.parse_args()
    L, h, P_ref = ns.layers, 64, 4
    rows = []
    for ds in ns.datasets:
        ref = Path(ns.out) / (f"{ds}-ref" if L == 2 else f"{ds}-ref-L{L}")
        if not (ref / "summary.json").is_file():
            subprocess.run(["rm", "-rf", str(ref)], check=True)
            subprocess.run(["commgnn", "train", "--dataset", ds, "--data-root", ns.root, "--parts", str(P_ref),
                            "--model", "gcn", "--layers", str(L), "--hidden", str(h), "--epochs", "4",
                            "--patience", "0", "--quiet", "--no-energy", "--out", str(ref)], check=True)
        summary = json.loads((ref / "summary.json").read_text())
        data = load_dataset(DataConfig(dataset=ds, root=ns.root))
        F, C = int(data.x.shape[1]), int(data.num_classes_total)
        ei = data.edge_index
        ref_parts = assign_parts(ei, data.num_nodes, P_ref, PartitionConfig())
        work_ref = float(work(ei, ref_parts, P_ref, F, h, L).max())
        levers = [Levers(name="exact"), Levers(name="8-bit halo", bits=8), Levers(name="4-bit halo", bits=4),
                  Levers(name="transform-first", transform_first=True),
                  Levers(name="transform-first + 4-bit", transform_first=True, bits=4),
                  Levers(name="precompute + transform-first", precompute=True, transform_first=True),
                  Levers(name="precompute + 4-bit", bits=4, precompute=True),
                  Levers(name="precompute + 4-bit + PowerSGD r1", bits=4, precompute=True,
                         grad_ratio=powersgd_ratio(F, h, C, layers=L))]
        for hosts in ns.hosts:
            parts = assign_parts(ei, data.num_nodes, hosts, PartitionConfig())
            for gbit in ns.rates_gbit:
                model = ClusterModel.written(hosts, 1, gbit * 1e9)
                preds = {lv.name: project_epoch(ei, data.num_nodes, model, F=F, h=h, L=L, C=C, levers=lv,
                                                compute_ref_s=summary["compute_alone_s"], work_ref=work_ref,
                                                parts=parts) for lv in levers}
                base = preds["exact"]["epoch"]
                for name, p in preds.items():
                    rows.append({"dataset": ds, "hosts": hosts, "link_Gbit_s": gbit, "levers": name,
                                 "epoch_ms": f"{p['epoch'] * 1e3:.1f}", "compute_ms": f"{p['compute'] * 1e3:.1f}",
                                 "comm_ms": f"{p['comm'] * 1e3:.1f}", "comm_share_%": f"{100 * p['comm'] / p['epoch']:.0f}",
                                 "MB_per_epoch": f"{p['bytes'] / 1e6:.1f}", "speedup_vs_exact": f"{base / p['epoch']:.2f}"})
        print(f"{ds}: compute alone at P={P_ref}: {summary['compute_alone_s'] * 1e3:.1f} ms", flush=True)
    stamp = datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "cost-model" / (ns.stamp or f"{stamp}-projection")
    write_table(rows, stem, f"Projected epoch time on 8 and 32 hosts ({stamp}): a cost-model projection, not a run", [
        f"GCN {L}x{h}, METIS, one rank per host (each with its own cores). Compute: the {P_ref}-rank reference "
        "run's compute alone, scaled by the busiest rank's work; comm: the halo rows each pair exchanges "
        "(counted from the partition) and the parameters' all-reduce, priced on a written alpha-beta model "
        "(NIC rate, 30 us latency, collective factor 1). The levers' measured accuracy on CS (8 ranks, 3 layers) "
        "is in `2026-11-30-halo-levers-cs.md`: precompute and 4-bit forward rows within 0.1 points of exact.",
        "Compute is one thread per rank (the reference ranks get one core each); a host with more cores "
        "computes faster, which leaves communication a larger share than shown.", *ns.note])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
