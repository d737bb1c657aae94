"""Run with the peers' Python (DGL 2.1.0): turn the bench's ``graph.npz`` into what a
peer reads, and partition it with the peer's own METIS.

    python dgl_prepare.py distdgl graph.npz PARTS OUT   # DistDGL: partition_graph (METIS)
    python dgl_prepare.py bnsgcn  graph.npz PARTS OUT   # BNS-GCN: OUT/synthetic.bin

Writes ``OUT/prepare.json``: the partition's directed edge cut (DistDGL) and seconds.
"""

import json
import sys
import time

import dgl
import numpy as np
import torch


def graph(path):
    z = np.load(path)
    ei = torch.from_numpy(z["edge_index"]).long()
    g = dgl.graph((ei[0], ei[1]), num_nodes=z["x"].shape[0])
    return g, z


def main():
    kind, path, parts, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    t0 = time.time()
    g, z = graph(path)
    info = {"nodes": g.num_nodes(), "edges": g.num_edges()}
    if kind == "distdgl":  # the example's names
        g.ndata["features"] = torch.from_numpy(z["x"]).float()
        g.ndata["labels"] = torch.from_numpy(z["y"]).long()
        for m in ("train_mask", "val_mask", "test_mask"):
            g.ndata[m] = torch.from_numpy(z[m]).bool()
        orig_nids, _ = dgl.distributed.partition_graph(g, "g", parts, out, part_method="metis",
                                                       balance_edges=True, return_mapping=True)
        meta = json.load(open(f"{out}/g.json"))
        bounds = [r[1] for r in meta["node_map"]["_N"]]
        new_of = torch.empty_like(orig_nids)
        new_of[orig_nids] = torch.arange(orig_nids.numel())
        part = torch.searchsorted(torch.tensor(bounds), new_of, right=True)
        src, dst = g.edges()
        info["cut_directed"] = int((part[src] != part[dst]).sum())
        info["cut_directed_share"] = info["cut_directed"] / max(g.num_edges(), 1)
    else:  # BNS-GCN's loader reads feat / label / masks; it partitions with its own METIS later
        g.ndata["feat"] = torch.from_numpy(z["x"]).float()
        g.ndata["label"] = torch.from_numpy(z["y"]).long()
        for m in ("train_mask", "val_mask", "test_mask"):
            g.ndata[m] = torch.from_numpy(z[m]).bool()
        dgl.save_graphs(f"{out}/synthetic.bin", [g])
    info["seconds"] = round(time.time() - t0, 2)
    json.dump(info, open(f"{out}/prepare.json", "w"))


if __name__ == "__main__":
    main()
