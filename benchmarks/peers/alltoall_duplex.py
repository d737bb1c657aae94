"""Does an all-to-all use both directions of a full-duplex link? gloo's
``all_to_all_single`` against commgnn's exchange (``commgnn.distributed.request.all_to_all``:
point-to-point messages posted together) between 2 emulated hosts, and a one-way send for
reference; writes ``benchmarks/results/peers/<date>-alltoall-duplex.md``. Needs root.

    python benchmarks/peers/alltoall_duplex.py --rate 100mbit --mb 50
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results" / "peers"

WORKER = r"""
import json, os, sys, time, torch, torch.distributed as dist
from commgnn.distributed.context import DistContext
from commgnn.distributed.request import all_to_all
rank, addr, mb, reps = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://{addr}:29511", rank=rank, world_size=2)
ctx = DistContext(rank=rank, world_size=2, local_rank=0, local_world_size=1, device=torch.device("cpu"),
                  backend="gloo", timeout_s=300.0)
n = int(mb * 2**20) // 4096  # rows of 1,024 float32 (feature rows)
send, recv = torch.ones(2 * n, 1024), torch.empty(2 * n, 1024)
counts = [0, n] if rank == 0 else [n, 0]
out = {}
for name in ("gloo all_to_all_single", "commgnn all_to_all", "one-way send"):
    times = []
    for _ in range(reps):
        dist.barrier(); t = time.perf_counter()
        if name.startswith("gloo"):
            dist.all_to_all_single(recv[:n], send[:n], counts, counts)
        elif name.startswith("commgnn"):
            all_to_all(ctx, None, send[:n], counts, counts)
        elif rank == 0:
            dist.send(send[:n], 1)
        else:
            dist.recv(recv[:n], 0)
        dist.barrier(); times.append(time.perf_counter() - t)
    out[name] = sorted(times)[len(times) // 2]
if rank == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--mb", type=float, default=50.0, help="MB each host sends")
    ap.add_argument("--reps", type=int, default=3)
    ns = ap.parse_args()
    from commgnn.cluster.config import ClusterConfig, parse_rate
    from commgnn.cluster.netns import EmulatedNetwork

    cfg = ClusterConfig(hosts=2, rate_bps=parse_rate(ns.rate))
    env = {"GLOO_SOCKET_IFNAME": "eth0", "PATH": "/usr/bin:/bin", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    with EmulatedNetwork(cfg) as net:
        procs = [subprocess.Popen([*net.prefix(h), sys.executable, "-c", WORKER, str(h), cfg.address(0), str(ns.mb),
                                   str(ns.reps)], stdout=subprocess.PIPE, text=True, env=env) for h in range(2)]
        out = procs[0].communicate()[0]
        procs[1].wait()
    res = json.loads(out.strip().splitlines()[-1])
    line_s = ns.mb * 2**20 * 8 / cfg.rate_bps
    rows = [f"| {k} | {v:.2f} s | {v / line_s:.2f} |" for k, v in res.items()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{datetime.date.today()}-alltoall-duplex.md"
    path.write_text("\n".join([
        f"# All-to-all on a full-duplex link ({datetime.date.today()})", "",
        f"2 emulated hosts (namespaces, tbf {ns.rate} each way), {ns.mb:g} MB from each host to the other "
        f"(one way: host 0 to host 1 only); median of {ns.reps}. The link's time for {ns.mb:g} MB one way: "
        f"{line_s:.2f} s.", "",
        "| exchange | time | / line time |", "|---|---|---|", *rows, "",
        f"Command: python benchmarks/peers/alltoall_duplex.py --rate {ns.rate} --mb {ns.mb:g}", ""]))
    print(path.read_text())


if __name__ == "__main__":
    main()
