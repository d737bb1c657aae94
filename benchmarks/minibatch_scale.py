"""Mini-batch training at scale: the synthetic graph with 1M nodes and 20M (directed)
edges by default (``--nodes``), 4 local ranks, one epoch of neighbour sampling, and the
summed peak RSS of all ranks (the issue's bound: under 20 GB); ``--sampler`` runs another
sampler (fan-out and batch size apply where the sampler has them). One ``commgnn train``
in a fresh interpreter. Writes a dated Markdown/CSV table to benchmarks/results/memory/.

    python benchmarks/minibatch_scale.py [--topology replicated|partitioned] [--sampler saint-node]
        [--layers 3 --hidden 256 --fanout 15,10,5] [--work DIR --tag=-wide]
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
num_nodes = {nodes}
avg_degree = 20.0
feature_dim = {features}
num_classes = 8
[data]
train_ratio = 0.1
val_ratio = 0.05
[model]
name = "sage"
layers = {layers}
hidden = {hidden}
[train]
mode = "minibatch"
epochs = 1
patience = 0
[minibatch]
sampler = "{sampler}"
fanout = [{fanout}]
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
memory_limit_gb = {limit}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="replicated")
    ap.add_argument("--sampler", default="neighbor", help="neighbor | vrgcn | cluster | saint-node | ...")
    ap.add_argument("--partitioner", default="metis")
    ap.add_argument("--cache", type=float, default=0.05)
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--fanout", default="15,10", help="comma-separated, one per layer")
    ap.add_argument("--work", default=None, help="folder for the run (kept; default: a new temp dir)")
    ap.add_argument("--memory-limit-gb", type=float, default=0.0,
                    help="runtime.memory_limit_gb (0: the machine's available memory)")
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    ns = ap.parse_args()
    work = Path(ns.work) if ns.work else Path(tempfile.mkdtemp(prefix="mb-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "scale.toml"
    cfg.write_text(TOML.format(topology=ns.topology, sampler=ns.sampler, partitioner=ns.partitioner, cache=ns.cache, nodes=ns.nodes,
                               features=ns.features, layers=ns.layers, hidden=ns.hidden,
                               fanout=", ".join(ns.fanout.split(",")), limit=ns.memory_limit_gb))
    t0 = time.time()
    subprocess.run(["commgnn", "train", "--config", str(cfg), "--out", str(work / "run"), "--quiet"], check=True)
    wall = time.time() - t0
    launcher_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summ = json.loads((work / "run" / "summary.json").read_text())
    row = json.loads((work / "run" / "metrics.jsonl").read_text().splitlines()[0])
    manifest = json.loads((work / "run" / "manifest.json").read_text())
    out = {
        "nodes": manifest["dataset"]["num_nodes"], "edges": manifest["dataset"]["num_edges"],
        "features": manifest["dataset"]["num_features"], "layers": ns.layers, "hidden": ns.hidden,
        "sampler": ns.sampler, "fanout": ns.fanout, "ranks": 4, "partitioner": ns.partitioner,
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
    day = datetime.date.today()
    stem = Path(__file__).resolve().parent / "results" / "memory" / f"{day}-minibatch-scale-{ns.topology}{ns.tag}"
    write_table([out], stem, f"Mini-batch training at {out['nodes']:,} nodes / {out['edges']:,} edges ({day})",
                [f"4 local gloo ranks; synthetic CSBM ({ns.features} features, 8 classes, 10% training nodes), GraphSAGE "
                 f"{ns.layers}x{ns.hidden}, "
                 + (f"neighbour sampling {ns.fanout}, batch 1024" if ns.sampler == "neighbor" else
                    f"sampler {ns.sampler} (its defaults)") + f", a {ns.cache:.0%} degree "
                 "cache; one epoch. Peak RSS per rank is Linux's VmHWM."])

if __name__ == "__main__":
    main()
