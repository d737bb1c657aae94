"""The pre-flight memory estimate against the peak memory runs really reach.

For each configuration, one ``commgnn train`` runs in a fresh interpreter (so the
launcher's own peak RSS is its own), and the table compares the estimate of
:mod:`commgnn.runner.preflight` with the measured peaks: the launcher's ``ru_maxrss`` and
every rank's (``summary.json``'s ``peak_rss_mb_by_rank``). An estimate should be an upper
bound that is not absurdly loose. Writes a dated Markdown/CSV table to benchmarks/results/.

    python benchmarks/preflight_memory.py
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

# (nodes, avg degree, features, model, layers, hidden, ranks)
GRID = [
    (20_000, 10, 64, "gcn", 2, 64, 2),
    (100_000, 20, 128, "gcn", 3, 128, 2),
    (100_000, 20, 128, "sage", 3, 128, 4),
    (300_000, 20, 128, "gcn", 3, 128, 4),
]

CHILD = """
import json, resource, sys
from commgnn.cli.main import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "launcher_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

ESTIMATE = """
import json, sys
from commgnn.runner.config import resolve_config
from commgnn.runner.preflight import estimate_memory
from commgnn.report import read_json
run = sys.argv[1]
m = read_json(run + "/manifest.json")
cfg = resolve_config(run + "/config.toml", {}, {})
d = m["dataset"]
est = estimate_memory(num_nodes=d["num_nodes"], num_edges=d["num_edges"], num_features=d["num_features"],
                      num_classes=d["num_classes"], report=m["partition"]["report"],
                      layers=cfg.model.layers, hidden=cfg.model.hidden)
print(json.dumps({"launcher": est.launcher / 2**20, "ranks": [r / 2**20 for r in est.per_rank]}))
"""


def run_one(n: int, deg: int, f: int, model: str, layers: int, hidden: int, P: int, work: Path) -> dict:
    cfg = work / f"n{n}-{model}-p{P}.toml"
    cfg.write_text(f"[data.synthetic]\nnum_nodes = {n}\navg_degree = {deg}\nfeature_dim = {f}\n"
                   f"[model]\nname = \"{model}\"\nlayers = {layers}\nhidden = {hidden}\n"
                   f"[train]\nepochs = 3\n[output]\nquiet = true\n")
    out = work / cfg.stem
    res = subprocess.run([sys.executable, "-c", CHILD, "train", "--config", str(cfg), "--parts", str(P),
                          "--out", str(out)], capture_output=True, text=True, check=True)
    child = json.loads(res.stdout.strip().splitlines()[-1])
    est = json.loads(subprocess.run([sys.executable, "-c", ESTIMATE, str(out)], capture_output=True,
                                    text=True, check=True).stdout)
    summary = json.loads((out / "summary.json").read_text())
    measured_ranks = summary["peak_rss_mb_by_rank"]
    measured = child["launcher_mb"] + sum(measured_ranks)
    estimated = est["launcher"] + sum(est["ranks"])
    return {"nodes": n, "avg_degree": deg, "features": f, "model": model, "layers": layers,
            "hidden": hidden, "ranks": P,
            "launcher_est_mb": round(est["launcher"]), "launcher_peak_mb": round(child["launcher_mb"]),
            "rank_est_mb_max": round(max(est["ranks"])), "rank_peak_mb_max": round(max(measured_ranks)),
            "total_est_mb": round(estimated), "total_peak_mb": round(measured),
            "est_over_peak": round(estimated / measured, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in GRID:
            rows.append(run_one(*spec, work=Path(tmp)))
            print(rows[-1], flush=True)
    day = datetime.date.today().isoformat()
    out = Path(args.out)
    with open(out / f"{day}-preflight-memory.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cols = list(rows[0])
    lines = [f"# Pre-flight memory estimate vs measured peak RSS ({day})", "",
             f"Machine: {len(os.sched_getaffinity(0))} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
             f"{platform.machine()}, Python {platform.python_version()}. Each run: 3 epochs, synthetic CSBM, "
             f"METIS. Peak = launcher ru_maxrss + every rank's peak RSS (MB = MiB). Command: "
             f"`python benchmarks/preflight_memory.py`.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    (out / f"{day}-preflight-memory.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
