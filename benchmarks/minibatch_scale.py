"""Mini-batch training at scale: the synthetic graph with 1M nodes and 20M (directed)
edges, 4 local ranks, one epoch of neighbour sampling, and the summed peak RSS of all
ranks (the issue's bound: under 20 GB). One ``commgnn train`` in a fresh interpreter.
Writes a dated Markdown/CSV table to benchmarks/results/.

    python benchmarks/minibatch_scale.py [--topology replicated|partitioned]
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from tables import write_table

TOML = """
[data.synthetic]
num_nodes = 1000000
avg_degree = 20.0
feature_dim = 64
num_classes = 8
[data]
train_ratio = 0.1
val_ratio = 0.05
[model]
name = "sage"
layers = 2
hidden = 64
[train]
mode = "minibatch"
epochs = 1
patience = 0
[minibatch]
sampler = "neighbor"
fanout = [15, 10]
batch_size = 1024
topology = "{topology}"
[fetch]
cache_ratio = {cache}
cache_policy = "degree"
[partition]
method = "{partitioner}"
[runtime]
parts = 4
timeout_s = 600
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="replicated")
    ap.add_argument("--partitioner", default="metis")
    ap.add_argument("--cache", type=float, default=0.05)
    ns = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mb-scale-"))
    cfg = work / "scale.toml"
    cfg.write_text(TOML.format(topology=ns.topology, partitioner=ns.partitioner, cache=ns.cache))
    t0 = time.time()
    subprocess.run(["commgnn", "train", "--config", str(cfg), "--out", str(work / "run"), "--quiet"], check=True)
    wall = time.time() - t0
    launcher_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summ = json.loads((work / "run" / "summary.json").read_text())
    row = json.loads((work / "run" / "metrics.jsonl").read_text().splitlines()[0])
    manifest = json.loads((work / "run" / "manifest.json").read_text())
    out = {
        "nodes": manifest["dataset"]["num_nodes"], "edges": manifest["dataset"]["num_edges"],
        "features": manifest["dataset"]["num_features"], "ranks": 4, "partitioner": ns.partitioner,
        "topology": ns.topology, "cache_ratio": ns.cache,
        "steps": row["steps"], "epoch_s": round(row["epoch_s"], 1), "train_loop_s": round(row["train_loop_s"], 1),
        "sample_s": round(row["sample_s"], 1), "fetch_s": round(row["fetch_s"], 1),
        "feature_GB": round((row["bytes"]["fetch_ids"] + row["bytes"]["fetch_rows"]) / 1e9, 2),
        "hit_rate": round(row.get("cache_hit_rate", 0.0), 3),
        "sampled_nodes_per_step": round(row["sampled_nodes_per_step"]),
        "val_acc": round(row["val_acc"], 4),
        "peak_rss_mb_by_rank": [round(x) for x in summ["peak_rss_mb_by_rank"]],
        "peak_rss_gb_sum": round(summ["peak_rss_mb_sum"] / 1024, 2),
        "launcher_peak_gb": round(launcher_mb / 1024, 2),
        "wall_s_incl_generation_and_partition": round(wall),
    }
    print(json.dumps(out, indent=1))
    stem = Path(__file__).resolve().parent / "results" / f"{datetime.date.today()}-minibatch-scale-{ns.topology}"
    write_table([out], stem, f"Mini-batch training at 1M nodes / 20M edges ({datetime.date.today()})",
                ["4 local gloo ranks; synthetic CSBM (64 features, 8 classes, 10% training nodes), GraphSAGE "
                 "2x64, neighbour sampling 15,10, batch 1024, a 5% degree cache; one epoch. Peak RSS per rank "
                 "is Linux's VmHWM."])

if __name__ == "__main__":
    main()
