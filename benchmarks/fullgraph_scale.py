"""Full-graph training at scale: peak memory per rank and summed, from 100k to 2M nodes.

The synthetic CSBM (average degree 20, 128 features, 8 classes) is partitioned once per
size by ``commgnn partition`` (METIS, 4 parts) in a fresh interpreter, whose own peak RSS
is the partitioning's memory. Then each (model, setting) trains a few epochs with
``--partition-dir``: every rank loads only its own part file. Memory, not accuracy, is
measured: the first epoch reaches the peak, and ``--epochs`` only steadies the epoch time.
Peak RSS per rank is Linux's VmHWM (``summary.json``'s ``peak_rss_mb_by_rank``); the
launcher's own peak (it generates the graph to fingerprint it, then frees it before the
ranks start) is reported apart.

Settings: ``exact`` (fp32 rows every layer) and ``levers`` (precompute the first layer's
aggregate, transform first, 4-bit forward / 8-bit backward rows: the best combination of
the Coauthor CS lever benchmark).

Rows are appended to ``--csv`` as they finish (a crash or a kill keeps the finished ones);
``--report-only`` rewrites the dated Markdown from it.

    python benchmarks/fullgraph_scale.py --sizes 100000 300000 1000000 2000000
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tables import write_table

RESULTS = Path(__file__).resolve().parent / "results" / "memory"

TOML = """
[data.synthetic]
num_nodes = {nodes}
avg_degree = 20.0
feature_dim = 128
num_classes = 8
[data]
train_ratio = 0.1
val_ratio = 0.05
[partition]
method = "metis"
[runtime]
parts = 4
timeout_s = 900
"""

SETTINGS = {
    "exact": [],
    "levers": ["--precompute", "--transform-first", "--bits", "4,8"],
}

# A child interpreter that runs one CLI command and prints its own peak RSS (ru_maxrss of
# this process only: the ranks' peaks come from summary.json).
CHILD = """
import json, resource, runpy, sys
sys.argv = ["commgnn", *sys.argv[1:]]
try:  # `python -m commgnn ARGS` in this process, so that its peak RSS is this process's
    runpy.run_module("commgnn", run_name="__main__")
    rc = 0
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_child(args: list[str]) -> tuple[dict, float]:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    wall = time.time() - t0
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    try:
        info = json.loads(last)
    except ValueError:
        info = {}
    if proc.returncode or info.get("rc"):
        raise RuntimeError(f"{' '.join(args[:3])} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return info, wall


def append(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def report(path: Path, stem: Path) -> None:
    rows = sorted(csv.DictReader(path.open()), key=lambda r: (int(r["nodes"]), r["model"], r["setting"]))
    notes = [
        "Synthetic CSBM (edges mostly within a class, endpoints uniform inside it: METIS keeps "
        "classes together and cuts about 17% of the edges at 1M nodes, yet every rank still "
        "receives about 511k halo rows, twice its 250k owned rows), average in-degree 20, 128 features, 8 classes; 4 local gloo ranks on "
        "the machine's 2 cores; hidden 128, 3 layers, dropout 0.5; "
        "partitioned once per size by `commgnn partition` (METIS), then each run loads it with "
        "`--partition-dir`.",
        "`partition peak GB` is the partitioning process's own peak RSS (graph generation included); "
        "`launcher peak GB` is the training launcher's (it regenerates the graph to check the "
        "fingerprint, then frees it before the ranks start); `ranks' peak GB (sum)` is the sum of the "
        "4 ranks' VmHWM, the issue's measure; `bytes/edge` divides it by the directed edge count.",
        "Accuracy after a few epochs is not a result here (memory benchmark); the exact training "
        "path is the one the parity tests check. Epoch times share the 2 cores with other jobs "
        "of the session, so they are indicative only.",
        "Kernel: `train.kernel = auto` (numba). GCN aggregates first when that is cheaper "
        "(`commgnn/models/gcn.py`): before that change, the 1M-node exact GCN run peaked at "
        "4.27 GB per rank and 16.6 GB summed (launcher 2.2 GB).",
        "Each run ends with the compute-alone measurement (`runtime.compute_alone`, on by default). "
        "Until 2026-12-03 it kept every halo block a rank received in one step while it replayed "
        "the step, and that, not training, set the runs' peak: `2026-12-01-fullgraph-scale.md` "
        "has the 1M-node exact GCN run at 3.64 GB per rank and 14.54 GB summed with it. It now "
        "keeps none: it times the step with zero rows of the blocks' shapes.",
    ]
    done = [r for r in rows if r.get("status") == "ok"]
    if done:
        top = max(done, key=lambda r: int(r["nodes"]))
        notes.append(f"The largest graph trained here: {int(top['nodes']):,} nodes / "
                     f"{int(top['edges']):,} edges.")
    failed = [r for r in rows if r.get("status") != "ok"]
    for r in failed:
        notes.append(f"{int(r['nodes']):,} nodes, {r['model']} {r['setting']}: {r['status']}")
    write_table(rows, stem, f"Full-graph memory scaling ({datetime.date.today()})", notes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 2_000_000])
    ap.add_argument("--models", nargs="+", default=["gcn", "sage"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--work", default=None, help="folder for partitions and runs (default: a temp dir)")
    ap.add_argument("--csv", default=str(RESULTS / f"{datetime.date.today()}-fullgraph-scale.csv"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--memory-limit-gb", default=None,
                    help="passed to train (the pre-flight estimate is an upper bound; raise it to measure)")
    ns = ap.parse_args()
    path = Path(ns.csv)
    stem = path.with_suffix("")
    if ns.report_only:
        report(path, stem)
        return
    work = Path(ns.work or tempfile.mkdtemp(prefix="fg-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    for n in ns.sizes:
        cfg = work / f"scale-{n}.toml"
        cfg.write_text(TOML.format(nodes=n))
        parts = work / f"parts-{n}"
        if not (parts / "meta.json").exists():
            pinfo, pwall = run_child(["partition", "--config", str(cfg), "--parts", "4", "--out", str(parts)])
            (work / f"parts-{n}.json").write_text(json.dumps({"peak_mb": pinfo["peak_mb"], "wall_s": pwall}))
        pmeta = json.loads((work / f"parts-{n}.json").read_text())
        meta = json.loads((parts / "meta.json").read_text())
        for model in ns.models:
            for setting in ns.settings:
                out = work / f"run-{n}-{model}-{setting}"
                args = ["train", "--config", str(cfg), "--partition-dir", str(parts), "--model", model,
                        "--layers", "3", "--hidden", "128", "--epochs", str(ns.epochs), "--patience", "0",
                        "--out", str(out), "--quiet", *SETTINGS[setting]]
                if ns.memory_limit_gb:
                    args += ["--memory-limit-gb", ns.memory_limit_gb]
                try:
                    info, wall = run_child(args)
                except RuntimeError as exc:
                    print(f"{n} {model} {setting}: {exc}", flush=True)
                    append(path, {"nodes": n, "edges": meta["num_edges"], "model": model, "setting": setting,
                                  "status": str(exc)[:200]})
                    continue
                s = json.loads((out / "summary.json").read_text())
                ranks_gb = s["peak_rss_mb_sum"] / 1024
                row = {
                    "nodes": n, "edges": meta["num_edges"], "model": model, "setting": setting,
                    "status": "ok",
                    "partition peak GB": round(pmeta["peak_mb"] / 1024, 2),
                    "partition s": round(pmeta["wall_s"]),
                    "halo rows/epoch (C)": meta["report"].get("comm_volume", ""),
                    "launcher peak GB": round(info["peak_mb"] / 1024, 2),
                    "ranks' peak GB (max)": round(s["peak_rss_mb"] / 1024, 2),
                    "ranks' peak GB (sum)": round(ranks_gb, 2),
                    "bytes/edge": round(ranks_gb * 2**30 / meta["num_edges"]),
                    "halo MB/epoch": round(s["halo_bytes_per_epoch"] / 1e6, 1),
                    "epoch s": round(s["epoch_time_s"], 2),
                    "wall s": round(wall),
                }
                print(json.dumps(row), flush=True)
                append(path, row)
    report(path, stem)
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()
