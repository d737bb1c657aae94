"""Sampler throughput: sampled edges per second of every sampler, in one process.

Each sampler draws the batches of one rank's epoch (``--parts`` METIS parts, rank 0's
training nodes as seeds; the whole graph's CSR, as a replicated topology) for
``--epochs`` epochs after one warm-up epoch, on one thread. Sampled edges are the
edges of all blocks (a subgraph sampler's one subgraph counted once per layer, as the
layers aggregate over it). Also shown: batches and sampled nodes per second.

    python benchmarks/sampler_throughput.py --datasets CS Physics synthetic-1m
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import torch

from commgnn.data import DataConfig, load_dataset
from commgnn.data.config import SyntheticConfig
from commgnn.partition import PartitionConfig, assign_parts
from commgnn.sampling.cluster import ClusterSampler
from commgnn.sampling.csr import CSRTopology
from commgnn.sampling.neighbor import NeighborSampler, replicated_source
from commgnn.sampling.saint import SaintSampler
from commgnn.sampling.vrgcn import VRGCNSampler
from tables import write_table


def samplers(csr: CSRTopology, own: torch.Tensor, train: torch.Tensor) -> dict[str, object]:
    seeds = own[train]
    src = replicated_source(csr, False)
    return {
        "neighbor 15,10 (batch 1024)": NeighborSampler(src, seeds, [15, 10], 1024),
        "neighbor 25,10 (batch 1024)": NeighborSampler(src, seeds, [25, 10], 1024),
        "neighbor 15,10,5 (batch 1024)": NeighborSampler(src, seeds, [15, 10, 5], 1024),
        "vrgcn 2,2 (batch 1024)": VRGCNSampler(csr, src, seeds, [2, 2], 1024),
        "cluster 40/4": ClusterSampler(csr, own, train, num_layers=2, num_clusters=40, clusters_per_batch=4, seed=0),
        "saint-node 2000": SaintSampler(csr, own, train, kind="node", num_layers=2, budget=2000),
        "saint-edge 2000": SaintSampler(csr, own, train, kind="edge", num_layers=2, budget=2000),
        "saint-rw 2000x2": SaintSampler(csr, own, train, kind="rw", num_layers=2, budget=2000),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["CS", "Physics", "synthetic-1m"])
    ap.add_argument("--root", default="../shared/datasets")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ns = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for ds in ns.datasets:
        if ds == "synthetic-1m":
            data = load_dataset(DataConfig(synthetic=SyntheticConfig(num_nodes=1_000_000, avg_degree=20.0)))
        else:
            data = load_dataset(DataConfig(dataset=ds, root=ns.root))
        parts = assign_parts(data.edge_index, data.num_nodes, ns.parts, PartitionConfig(method="metis"))
        csr = CSRTopology.from_edge_index(data.edge_index, data.num_nodes)
        own = (parts == 0).nonzero().flatten()
        train = data.train_mask[own]
        for name, s in samplers(csr, own, train).items():
            steps = max(1, s.num_batches())
            gen = torch.Generator().manual_seed(0)
            for _ in s.epoch(steps, gen):  # warm-up
                pass
            edges = nodes = batches = 0
            t0 = time.perf_counter()
            for _ in range(ns.epochs):
                for b in s.epoch(steps, gen):
                    edges += b.num_sampled_edges
                    nodes += b.num_sampled_nodes
                    batches += 1
            dt = time.perf_counter() - t0
            rows.append({"graph": ds, "sampler": name, "batches": batches, "seconds": f"{dt:.2f}",
                         "sampled_edges_per_s": f"{edges / dt / 1e6:.2f} M",
                         "sampled_nodes_per_s": f"{nodes / dt / 1e6:.2f} M", "batches_per_s": f"{batches / dt:.1f}"})
            print(rows[-1], flush=True)
    stem = Path(__file__).resolve().parent / "results" / "minibatch" / f"{datetime.date.today()}-sampler-throughput"
    write_table(rows, stem, f"Sampler throughput, one process, one thread ({datetime.date.today()})",
                [f"Rank 0 of {ns.parts} METIS parts: its training nodes are the seeds; the whole graph's CSR; "
                 f"{ns.epochs} epochs after a warm-up (protocol in `benchmarks/sampler_throughput.py`)."])


if __name__ == "__main__":
    main()
