"""A large graph from files on disk: partition it once, then train from the partition files.

Run it as ``python examples/large_graph.py [WORK_DIR]``. It writes a graph file (a
``torch.save``d dict with ``x``, ``edge_index`` and ``y``), partitions it once with
``commgnn partition`` (which prints the partition's quality), and trains from the
partition directory, where each rank reads only its own ``part_{r}.pt``. The graph here is
small so that the script runs in seconds; the commands are the same for a graph of
millions of nodes.
"""

import json
import subprocess
import sys
from pathlib import Path

import torch


def commgnn(*args: str) -> None:
    """Run one ``commgnn`` command, as a shell would (``python -m commgnn`` is the same program)."""
    subprocess.run([sys.executable, "-m", "commgnn", *args], check=True)


if __name__ == "__main__":
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example-large-graph")
    work.mkdir(parents=True, exist_ok=True)

    # %% 1. The graph as a file: features x [N, F], edges edge_index [2, E], labels y [N]
    g = torch.Generator().manual_seed(0)
    n, classes = 3000, 4
    y = torch.randint(0, classes, (n,), generator=g)
    src = torch.randint(0, n, (30000,), generator=g)
    same = y[torch.randint(0, n, (30000,), generator=g)] == y[src]  # keep most same-class edges
    dst = torch.where(same, torch.randint(0, n, (30000,), generator=g), (src + 1) % n)
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)  # undirected
    x = torch.nn.functional.one_hot(y, classes).float() + 0.8 * torch.randn(n, classes, generator=g)
    x = torch.cat([x, torch.randn(n, 12, generator=g)], 1)
    graph = work / "graph.pt"
    torch.save({"x": x, "edge_index": edge_index, "y": y}, graph)  # masks optional: 60/20/20 split

    # %% 2. Partition once (METIS; --partitioner ldg streams with about half the memory)
    parts = work / "parts"
    commgnn("partition", "--dataset", str(graph), "--parts", "2", "--out", str(parts))

    # %% 3. Train from the partition directory: each rank loads only its own part file
    run = work / "run"
    commgnn("train", "--dataset", str(graph), "--partition-dir", str(parts), "--parts", "2",
            "--model", "gcn", "--layers", "2", "--hidden", "32", "--epochs", "20",
            "--no-energy", "--quiet", "--out", str(run))

    summary = json.loads((run / "summary.json").read_text())
    print(f"test accuracy {summary['test_acc']:.3f}, halo {summary['halo_bytes_per_epoch'] / 1e3:.1f} kB "
          f"per epoch; partition files in {parts}, run folder {run}")
