"""Peak memory per rank under torchrun: who holds the whole graph.

``commgnn train`` under torchrun with 4 ranks on one machine, on the synthetic CSBM (average
degree 20, 128 features, 8 classes, METIS), two ways side by side in one run:

* ``rank 0 partitions`` (this checkout): rank 0 loads and partitions the graph and sends
  each rank its partition; ranks 1-3 never hold the graph;
* ``partition dir``: ``commgnn partition`` once, then ``--partition-dir``: no rank loads
  the graph (the directory records the run's ``[data]`` table);
* with ``--baseline CHECKOUT`` (a checkout of an earlier commit), the same command run by
  that code: there every rank loaded and partitioned the whole graph.

Each rank's peak is Linux's VmHWM (``summary.json``'s ``peak_rss_mb_by_rank``), so it
includes whatever the rank held before training. A few epochs only: memory, not accuracy.

    python benchmarks/torchrun_memory.py --nodes 300000 --baseline /path/to/old-checkout
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fullgraph_scale import TOML as SCALE_TOML
from tables import write_table

RESULTS = Path(__file__).resolve().parent / "results" / "memory"
ROOT = Path(__file__).resolve().parent.parent

# The scale benchmark's graph and partitioner (its [runtime] parts is replaced by torchrun's
# world size), with this benchmark's model and epochs.
TOML = SCALE_TOML + """
[model]
layers = 3
hidden = 128
[train]
epochs = {epochs}
patience = 0
[output]
quiet = true
"""


def torchrun(args: list[str], code: Path, ranks: int) -> float:
    """Run ``commgnn ARGS`` under torchrun with ``code`` first on the path; wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
           "--master-addr", "127.0.0.1", "--master-port", str(29000 + os.getpid() % 1000), "-m", "commgnn", *args]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
    return time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=300_000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--baseline", help="a checkout of an earlier commit to run the same command with")
    ap.add_argument("--baseline-label", default="every rank partitions (before)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(RESULTS / f"{datetime.date.today()}-torchrun-memory"))
    ns = ap.parse_args()
    work = Path(ns.work or tempfile.mkdtemp(prefix="tr-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "run.toml"
    cfg.write_text(TOML.format(nodes=ns.nodes, epochs=ns.epochs))
    done = work / "rows.jsonl"  # finished rows (a rerun of the same work folder skips them)
    rows = [json.loads(ln) for ln in done.read_text().splitlines()] if done.exists() else []
    for P in ns.ranks:
        parts = work / f"parts-{P}"
        if not (parts / "meta.json").exists():
            subprocess.run([sys.executable, "-m", "commgnn", "partition", "--config", str(cfg), "--parts", str(P),
                            "--out", str(parts)], check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        entries = [("rank 0 partitions, sends partitions (now)", ROOT, []),
                   ("--partition-dir, no rank loads the graph (now)", ROOT, ["--partition-dir", str(parts)])]
        if ns.baseline:
            entries.insert(0, (ns.baseline_label, Path(ns.baseline), []))
        for label, code, extra in entries:
            if any(r["setting"] == label and r["ranks"] == P and r["nodes"] == ns.nodes for r in rows):
                continue
            out = work / f"run-{P}-{len(rows)}"
            wall = torchrun(["train", "--config", str(cfg), "--out", str(out), *extra], code, P)
            s = json.loads((out / "summary.json").read_text())
            by_rank = [mb / 1024 for mb in s["peak_rss_mb_by_rank"]]
            row = {"setting": label, "nodes": ns.nodes, "ranks": P,
                   "edges": json.loads((parts / "meta.json").read_text())["num_edges"],
                   "rank 0 GB": round(by_rank[0], 2), "other ranks GB (max)": round(max(by_rank[1:]), 2),
                   "sum GB": round(sum(by_rank), 2), "wall s": round(wall)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            with done.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
    notes = ["GCN 3x128 on the synthetic CSBM (average degree 20, 128 features, 8 classes), METIS; "
             f"torchrun ranks on one machine (gloo), {ns.epochs} epochs; peak RSS is each rank's VmHWM "
             "(summary.json), so it counts what a rank held before training as well as training itself. "
             "Wall seconds include start-up and partitioning and shared the cores with other jobs: indicative only.",
             "Partition directories were made once by `commgnn partition` (its own memory is not in the table)."]
    write_table(rows, Path(ns.out), f"Peak memory per rank under torchrun ({datetime.date.today()})", notes)
    print(f"wrote {ns.out}.md")


if __name__ == "__main__":
    main()
