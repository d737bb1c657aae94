"""The peers' entries of :mod:`run`: DistDGL and BNS-GCN, each started on the emulated
hosts from the environment ``setup.sh`` built (``CACHE/dgl-venv``, ``CACHE/src``).

Each is run as its own launcher would run it, without ssh:

* **DistDGL** (``dgl`` 2.1.0's ``examples/distributed/graphsage/node_classification.py``,
  unmodified): per host one server (``DGL_ROLE=server``) and one trainer
  (``DGL_ROLE=client``, torch.distributed over gloo on ``eth0``), both in one private
  ``/dev/shm``, with the variables ``tools/launch.py`` sets; the graph partitioned by
  ``dgl.distributed.partition_graph`` (METIS, ``balance_edges``). An epoch ends at the
  line with host 0's validation accuracy (evaluated every epoch, ``--eval_every 1``).
* **BNS-GCN** (its ``main.py`` at the pinned commit with ``patches/bnsgcn-cpu.patch``),
  ``--parts-per-node 1`` and ``--node-rank h`` on host h, ``--sampling-rate`` = ``--p-rate``;
  partitioned by its own ``graph_partition`` (METIS, ``vol``) before the hosts start. An
  epoch ends at rank 0's per-epoch line; validation accuracy comes from its asynchronous
  evaluation (every epoch).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from procs import HostProcesses, Job

MB = {"layers": 2, "hidden": 256, "fan_out": "10,25", "batch": 1000, "lr": 0.003, "dropout": 0.5}
FULL = {"layers": 3, "hidden": 256, "lr": 0.01, "dropout": 0.5}


def _python(cache: Path) -> str:
    py = cache / "dgl-venv" / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"no peers' environment in {cache}: run benchmarks/peers/setup.sh first")
    return str(py)


def _prepare(py: str, kind: str, out: Path, parts: int) -> dict[str, Any]:
    dest = out / kind
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    subprocess.run([py, str(Path(__file__).with_name("dgl_prepare.py")), kind, str(out / "graph.npz"), str(parts),
                    str(dest)], check=True, env={"DGLBACKEND": "pytorch", "PATH": "/usr/bin:/bin",
                                                 "OMP_NUM_THREADS": "2"})
    info = json.loads((dest / "prepare.json").read_text())
    info["wall_s"] = round(time.monotonic() - t0, 2)
    return info


def run_peer(ns: argparse.Namespace, cfg: Any, net: Any, hp: HostProcesses, out: Path,
             epochs: dict[int, float], accs: dict[int, tuple[float, float]]) -> dict[str, int | None]:
    cache = Path(ns.cache)
    py = _python(cache)
    if ns.system == "distdgl":
        return _distdgl(ns, cfg, hp, out, py, cache, epochs, accs)
    return _bnsgcn(ns, cfg, hp, out, py, cache, epochs, accs)


def _follow(hp: HostProcesses, names: list[str], timeout: float, parse: Any) -> dict[str, int | None]:
    deadline = time.monotonic() + timeout
    codes = hp.wait(names, 0.0)
    while time.monotonic() < deadline and any(c is None for c in codes.values()):
        if any(c not in (None, 0) for c in codes.values()):
            break
        parse()
        codes = hp.wait(names, 0.5)
    parse()
    return codes


def _distdgl(ns, cfg, hp, out, py, cache, epochs, accs):
    prep = _prepare(py, "distdgl", out, cfg.hosts)
    (out / "prepare-distdgl.json").write_text(json.dumps(prep))
    work = out / "distdgl"
    ipc = work / "ip_config.txt"
    ipc.write_text("".join(f"{cfg.address(h)} 30050\n" for h in range(cfg.hosts)))
    example = cache / "src" / "dgl" / "examples" / "distributed" / "graphsage" / "node_classification.py"
    app = [py, str(example), "--graph_name", "g", "--ip_config", str(ipc), "--part_config", str(work / "g.json"),
           "--num_epochs", str(ns.epochs), "--num_hidden", str(MB["hidden"]), "--num_layers", str(MB["layers"]),
           "--fan_out", MB["fan_out"], "--batch_size", str(MB["batch"]), "--lr", str(MB["lr"]),
           "--dropout", str(MB["dropout"]), "--eval_every", "1", "--log_every", "1000000"]
    common = {"DGL_NUM_SERVER": "1", "DGL_NUM_CLIENT": str(cfg.hosts), "DGL_NUM_SAMPLER": "0",
              "DGL_IP_CONFIG": str(ipc), "DGL_CONF_PATH": str(work / "g.json"), "DGL_GRAPH_FORMAT": "csc",
              "OMP_NUM_THREADS": "1", "DGLBACKEND": "pytorch", "PYTHONUNBUFFERED": "1"}
    q = " ".join(f"'{a}'" for a in app)
    for h in range(cfg.hosts):
        server = " ".join(f"{k}={v}" for k, v in {**common, "DGL_ROLE": "server", "DGL_SERVER_ID": str(h)}.items())
        client = {**common, "DGL_ROLE": "client", "DGL_DIST_MODE": "distributed", "DGL_GROUP_ID": "0",
                  "MASTER_ADDR": cfg.address(0), "MASTER_PORT": "29500", "WORLD_SIZE": str(cfg.hosts),
                  "RANK": str(h), "LOCAL_RANK": "0", "GLOO_SOCKET_IFNAME": "eth0"}
        trainer = " ".join(f"{k}={v}" for k, v in client.items())
        script = (f"env {server} {q} & SP=$!; env {trainer} {q}; rc=$?; "
                  f"wait $SP; exit $rc")
        hp.start(Job(host=h, name=f"host{h}", argv=["sh", "-c", script], cwd=str(work), private_shm=True))
    rx = re.compile(r"Part (\d+), Val Acc ([\d.]+), Test Acc ([\d.]+)")

    def parse() -> None:
        per: dict[int, list[tuple[float, float, float]]] = {}
        for t, m in hp.matching(rx.pattern):
            per.setdefault(int(m.group(1)), []).append((t, float(m.group(2)), float(m.group(3))))
        host0 = per.get(0, [])
        for e, (t, _, _) in enumerate(host0, start=1):
            epochs.setdefault(e, t)
            got = [rows[e - 1] for rows in per.values() if len(rows) >= e]
            # each part scores its own share of the split (node_split, force_even): the mean
            accs[e] = (sum(g[1] for g in got) / len(got), sum(g[2] for g in got) / len(got))

    return _follow(hp, [f"host{h}" for h in range(cfg.hosts)], ns.timeout, parse)


def _bnsgcn(ns, cfg, hp, out, py, cache, epochs, accs):
    prep = _prepare(py, "bnsgcn", out, cfg.hosts)
    src = cache / "src" / "BNS-GCN"
    data, parts = out / "bnsgcn", out / "bnsgcn" / "partitions"
    args = ["--dataset", "synthetic", "--data-path", str(data), "--part-path", str(parts),
            "--graph-name", "g", "--n-partitions", str(cfg.hosts), "--model", "graphsage",
            "--n-layers", str(FULL["layers"]), "--n-hidden", str(FULL["hidden"]), "--lr", str(FULL["lr"]),
            "--dropout", str(FULL["dropout"]), "--sampling-rate", str(ns.p_rate), "--use-pp", "--fix-seed",
            "--seed", str(ns.seed), "--backend", "gloo", "--n-epochs", str(ns.epochs), "--log-every", "1"]
    env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DGLBACKEND": "pytorch", "PYTHONUNBUFFERED": "1",
           "PATH": "/usr/bin:/bin"}
    t0 = time.monotonic()
    part_code = ("import sys; sys.argv = ['main.py'] + sys.argv[1:]; import cpu_shim; "
                 "from helper.parser import create_parser; from helper.utils import graph_partition; "
                 "graph_partition(create_parser())")
    subprocess.run([py, "-c", part_code, *args], cwd=src, env=env, check=True)
    prep["partition_wall_s"] = round(time.monotonic() - t0, 2)
    (out / "prepare-bnsgcn.json").write_text(json.dumps(prep))
    for h in range(cfg.hosts):
        hp.start(Job(host=h, name=f"host{h}", cwd=str(src),
                     argv=[py, "main.py", *args, "--parts-per-node", "1", "--node-rank", str(h),
                           "--master-addr", cfg.address(0), "--port", "18118", "--skip-partition"],
                     env={**env, "GLOO_SOCKET_IFNAME": "eth0"}))
    ep = re.compile(r"Process 000 \| Epoch (\d+) \|")
    acc = re.compile(r"Epoch (\d+) \| Validation Accuracy ([\d.]+)% \| Test Accuracy ([\d.]+)%")

    def parse() -> None:
        for t, m in hp.matching(ep.pattern, host=0):
            epochs.setdefault(int(m.group(1)) + 1, t)
        for _, m in hp.matching(acc.pattern, host=0):
            accs[int(m.group(1)) + 1] = (float(m.group(2)) / 100, float(m.group(3)) / 100)

    return _follow(hp, [f"host{h}" for h in range(cfg.hosts)], ns.timeout, parse)
