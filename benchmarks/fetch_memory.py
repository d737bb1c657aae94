"""Peak memory of one remote feature fetch, as a multiple of the ``[n, F]`` rows it returns.

Each of P gloo ranks owns ``N / P`` rows of width F (owner = id mod P) and fetches the rows
of a random half of the graph in one :meth:`FeatureFetcher.fetch` (so about ``(P-1)/P`` of
them are remote, and every rank serves as many rows as it asks for). The high-water mark of
the process's RSS is reset just before the call (``/proc/self/clear_refs``) and read right
after it: the difference is what the fetch itself held at its peak. Run it against a tree
with ``PYTHONPATH``; each run appends its rows (labelled ``--label``) to the dated table.

    PYTHONPATH=. python benchmarks/fetch_memory.py --label "$(git rev-parse --short HEAD)"
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
from pathlib import Path

import torch

from commgnn.distributed.context import LaunchInfo, RuntimeConfig, free_port, init_distributed, shutdown
from commgnn.distributed.events import Hooks
from commgnn.distributed.spawn import spawn_ranks
from commgnn.fetch.fetcher import FeatureFetcher


def _status(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _rank(info: LaunchInfo, N: int, F: int, out: str) -> None:
    ctx = init_distributed(info, RuntimeConfig(parts=info.world_size, timeout_s=120, threads=1))
    P, rank = ctx.world_size, ctx.rank
    owner, row = torch.arange(N) % P, torch.arange(N) // P
    table = torch.rand(((N - rank + P - 1) // P, F))
    fetcher = FeatureFetcher(ctx, Hooks(), table=table, owner=owner, row=row, record_trace=False)
    ids = torch.randperm(N, generator=torch.Generator().manual_seed(rank))[: N // 2]
    ctx.barrier()
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    rows = fetcher.fetch(ids)
    peak = _status("VmHWM")
    torch.save({"extra_mb": peak - base, "result_mb": rows.numel() * 4 / 2**20,
                "remote": float((owner[ids] != rank).float().mean())}, f"{out}/rank{rank}.pt")
    shutdown(ctx)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True, help="what tree ran (e.g. a commit)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--features", type=int, default=4096)
    ns = ap.parse_args()
    lines = []
    for P in ns.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            spawn_ranks(_rank, (ns.nodes, ns.features, tmp), nprocs=P, master_addr="127.0.0.1", port=free_port())
            res = [torch.load(f"{tmp}/rank{r}.pt") for r in range(P)]
        worst = max(r["extra_mb"] / r["result_mb"] for r in res)
        lines.append(f"| {ns.label} | {P} | {ns.nodes} | {ns.features} | {res[0]['result_mb']:.0f} | "
                     f"{sum(r['remote'] for r in res) / P:.2f} | {max(r['extra_mb'] for r in res):.0f} | {worst:.2f} |")
    path = Path(__file__).resolve().parent / "results" / "memory" / f"{datetime.date.today().isoformat()}-fetch-memory.md"
    if not path.exists():
        path.write_text(
            f"# Peak memory of one remote feature fetch ({datetime.date.today().isoformat()})\n\n"
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
            "`benchmarks/fetch_memory.py`: each rank fetches the rows of a random half of the graph in "
            "one call; `extra MB` = the process's RSS high-water mark over the call less its RSS "
            "before it (largest rank); `x result` = that over the `[n, F]` float32 rows returned.\n\n"
            "| tree | ranks | nodes | features | result MB | remote share | extra MB | x result |\n"
            "|---|---|---|---|---|---|---|---|\n")
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
