"""Bytes of raw feature rows sent through the lossless sparse codec, against dense fp32.

Raw features of the usual GNN benchmarks are bag-of-words: mostly zeros, every non-zero 1.0.
Two places send them:

- **full graph, precompute**: the one-time set-up exchange of the input rows of the halo
  (``comm.halo.sparse_setup``, on by default since 2026-12-02). GCN 3x64, 8 METIS parts,
  one epoch (the set-up does not depend on training): set-up bytes and ``setup_s``.
- **mini-batch fetches**: neighbour sampling (GraphSAGE 2x64, fan-out 15,10, batch 512,
  4 METIS parts, as in ``minibatch.py``), fp32 rows dense (``--fetch-bits 32``) or sparse
  (``--fetch-sparse``), with and without a 25% degree cache, beside 4-bit rows with the
  cache (the lossy lever of the mini-batch table). Two epochs; feature bytes per epoch,
  cache hit rate, the epoch time and its fetch share.

The sparse codec is lossless, and training with it is bit for bit the dense run's (tests:
``test_sparse_setup.py``, ``test_minibatch.py::test_sparse_fetch_trains_identically``), so
its accuracy is the fp32 entries' of ``minibatch.py``'s tables; only bytes and time are
measured here. Runs are resumable (a finished run directory is read, not rerun).

    python benchmarks/sparse_rows.py --datasets CS Computers Physics
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tables import write_table

FULL = ["--model", "gcn", "--layers", "3", "--hidden", "64", "--epochs", "1", "--precompute", "--quiet"]
MB = ["--model", "sage", "--layers", "2", "--hidden", "64", "--mode", "minibatch", "--sampler", "neighbor",
      "--fanout", "15,10", "--batch-size", "512", "--epochs", "2", "--patience", "0", "--quiet"]
CACHE = ["--cache-ratio", "0.25", "--cache-policy", "degree"]
ENTRIES: dict[str, tuple[int, list[str]]] = {
    "full graph, precompute, dense set-up": (8, [*FULL, "--config", "{dense_setup}"]),
    "full graph, precompute, sparse set-up": (8, FULL),
    "mini-batch fp32": (4, MB),
    "mini-batch fp32 sparse": (4, [*MB, "--fetch-sparse"]),
    "mini-batch 25% cache + fp32": (4, [*MB, *CACHE]),
    "mini-batch 25% cache + fp32 sparse": (4, [*MB, *CACHE, "--fetch-sparse"]),
    "mini-batch 25% cache + 4-bit": (4, [*MB, *CACHE, "--fetch-bits", "4"]),
}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def run_all(ns: argparse.Namespace, out: Path) -> None:
    dense = out / "dense-setup.toml"
    dense.write_text("[comm.halo]\nsparse_setup = false\n")
    for ds in ns.datasets:
        for name, (parts, flags) in ENTRIES.items():
            run = out / ds / _slug(name)
            if (run / "summary.json").is_file():
                continue
            subprocess.run(["rm", "-rf", str(run)], check=True)
            pdir = out / f"{ds}-parts{parts}"
            if not (pdir / "meta.json").is_file():
                subprocess.run([sys.executable, "-m", "commgnn", "partition", "--dataset", ds, "--data-root", ns.root,
                                "--parts", str(parts), "--partitioner", "metis", "--out", str(pdir)], check=True,
                               stdout=subprocess.DEVNULL)
            where = ["--partition-dir", str(pdir), "--parts", str(parts)]
            args = [a.format(dense_setup=dense) for a in flags]
            subprocess.run([sys.executable, "-m", "commgnn", "train", "--dataset", ds, "--data-root", ns.root,
                            *where, "--seed", "0", *args, "--out", str(run)], check=True)
            print(f"{ds} {name}: done", flush=True)


def report(ns: argparse.Namespace, out: Path) -> None:
    rows: list[dict[str, Any]] = []
    for ds in ns.datasets:
        base: dict[str, float] = {}
        for name in ENTRIES:
            p = out / ds / _slug(name) / "summary.json"
            if not p.is_file():
                continue
            s = json.loads(p.read_text())
            metrics = [json.loads(x) for x in (p.parent / "metrics.jsonl").read_text().splitlines()]
            if name.startswith("full"):
                mb = s["setup_bytes"]["halo_setup"] / 1e6
                base.setdefault("full", mb)
                rows.append({"dataset": ds, "entry": name, "ranks": ENTRIES[name][0],
                             "feature MB (set-up, once)": f"{mb:.3f}", "reduction": f"{base['full'] / mb:.1f}x",
                             "cache hit rate": "—", "set-up s": f"{s['setup_s']:.1f}", "epoch s": "—",
                             "fetch s / epoch": "—"})
                continue
            mb = s["feature_bytes_per_epoch"] / 1e6
            base.setdefault("mb", mb)
            hit = s.get("cache_hit_rate")
            rows.append({"dataset": ds, "entry": name, "ranks": ENTRIES[name][0],
                         "feature MB (per epoch)": f"{mb:.2f}", "reduction": f"{base['mb'] / mb:.1f}x",
                         "cache hit rate": f"{100 * hit:.1f}%" if hit is not None else "—",
                         "set-up s": f"{s['setup_s']:.1f}",
                         "epoch s": f"{statistics.mean(r['epoch_s'] for r in metrics):.2f}",
                         "fetch s / epoch": f"{statistics.mean(r['time_mean_s']['fetch'] for r in metrics):.2f}"})
    for r in rows:  # one column for both kinds of bytes
        r["feature MB"] = r.pop("feature MB (set-up, once)", None) or r.pop("feature MB (per epoch)")
    cols = ["dataset", "entry", "ranks", "feature MB", "reduction", "cache hit rate", "set-up s", "epoch s",
            "fetch s / epoch"]
    rows = [{k: r[k] for k in cols} for r in rows]
    stamp = ns.stamp or datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "minibatch" / f"{stamp}-sparse-rows"
    write_table(rows, stem, f"Raw feature rows through the lossless sparse codec ({stamp})", [
        "`python benchmarks/sparse_rows.py`. Full graph: GCN 3x64 with precompute, 8 METIS parts, one epoch "
        "(the set-up does not depend on training). Mini-batch: GraphSAGE 2x64, neighbour sampling (fan-out 15,10, "
        "batch 512), 4 METIS parts, two epochs. The codec is lossless and training with it is bit for bit the "
        "dense run's (tested), so accuracy is that of the fp32 entries of the mini-batch table; only bytes and "
        "time are measured here.",
        "Full-graph rows: the halo's input rows, moved once before training (MB summed over ranks; reduction "
        "against the dense set-up). Mini-batch rows: feature MB per epoch summed over ranks (ids and rows; "
        "reduction against the uncached fp32 fetch), time = mean over the 2 epochs of the slowest rank's epoch "
        "and the mean rank's fetch seconds. The ranks share the machine's 2 cores over loopback: times compare "
        "within a dataset, not with a real network. Seed 0.", *ns.note])
    print(stem.with_suffix(".md").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["CS", "Computers", "Physics"])
    ap.add_argument("--root", default=os.environ.get("COMMGNN_DATA_ROOT", "../shared/datasets"))
    ap.add_argument("--out", default="runs/bench-sparse-rows")
    ap.add_argument("--stamp", help="date in the result file names (default: today)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--note", action="append", default=[], help="a note on this run for the table")
    ns = ap.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if not ns.report_only:
        run_all(ns, out)
    report(ns, out)


if __name__ == "__main__":
    sys.exit(main())
