"""METIS edge-cut vs communication-volume objective: the halo rows each makes ranks move.

The objective changes only which rows cross partitions, so training stays exact and halo
bytes scale with C (rows moved per exchanged column) and the busiest rank's halo. Writes a
dated Markdown/CSV table to benchmarks/results/partition/.

    python benchmarks/metis_objective.py --data-root ../shared/datasets --parts 8 CS Computers
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import time
from pathlib import Path

from commgnn.data import DataConfig, load_dataset
from commgnn.partition import PartitionConfig, assign_parts, partition_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="+")
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "partition"))
    args = ap.parse_args()
    rows = []
    for name in args.datasets:
        data = load_dataset(DataConfig(dataset=name, root=args.data_root))
        for objective in ("cut", "vol"):
            t0 = time.perf_counter()
            parts = assign_parts(data.edge_index, data.num_nodes, args.parts,
                                    PartitionConfig(method="metis", objective=objective))
            secs = time.perf_counter() - t0
            rep = partition_report(data.edge_index, parts, args.parts)
            rows.append({"dataset": name, "parts": args.parts, "objective": objective,
                         "edge_cut": rep.edge_cut, "comm_volume": rep.comm_volume,
                         "max_halo_in": rep.max_halo_in, "max_halo_out": rep.max_halo_out,
                         "seconds": round(secs, 2)})
    for r in rows:
        cut = next(c for c in rows if c["dataset"] == r["dataset"] and c["objective"] == "cut")
        r["volume_vs_cut"] = round(r["comm_volume"] / cut["comm_volume"], 3)
    day = datetime.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{day}-metis-objective.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# METIS objective: edge cut vs communication volume ({day})", "",
             f"`python benchmarks/metis_objective.py --parts {args.parts} {' '.join(args.datasets)}` on "
             f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             "pymetis k-way with the given objective. C = halo rows moved per exchanged column (all ranks); "
             "the halo bytes of every exchange scale with it, exactly.", "",
             "| dataset | P | objective | edge cut | C (rows) | C / C_cut | max halo in | max halo out | s |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dataset']} | {r['parts']} | {r['objective']} | {r['edge_cut']:,} | {r['comm_volume']:,} | "
              f"{r['volume_vs_cut']:.3f} | {r['max_halo_in']:,} | {r['max_halo_out']:,} | {r['seconds']} |" for r in rows]
    (out / f"{day}-metis-objective.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
