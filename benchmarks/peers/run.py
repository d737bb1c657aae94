"""Run one system of the peers' bench on an emulated cluster; write ``OUT/result.json``.

    python benchmarks/peers/run.py --system commgnn-mb --dataset CS --hosts 2 --rate 1gbit \
        --epochs 10 --seed 0 --out /tmp/peers/cs-mb

Systems: ``commgnn-mb`` (mini-batch, exact fetch: fp32, no cache), ``commgnn-mb-plan``
(mini-batch with its levers: see :data:`LEVERS`), ``commgnn-full`` (full-graph, exact, the input aggregated once as BNS-GCN's ``--use-pp``),
``commgnn-full-levers``, ``distdgl`` (DGL 2.1.0's distributed GraphSAGE example, its own
servers and trainers, one of each a host) and ``bnsgcn`` (BNS-GCN, ``--p-rate``). The
peers run from the environment ``setup.sh`` builds (``--cache``).

Every system runs on the same emulated hosts (``commgnn.cluster.netns``: one namespace a
host, links shaped with tc), its bytes counted by the hosts' interface counters
(:mod:`wire`), its epochs timed by the monotonic clock at the moment each epoch's line (or
``metrics.jsonl`` row) appears, its memory as the summed PSS of every process in the
namespaces. The protocol (one for every system):

* mini-batch: GraphSAGE 2 x 256, fan-outs 25 at hop 1 and 10 at hop 2 (DGL's ``--fan_out
  10,25`` lists the input layer first), batch 1000, Adam lr 0.003, dropout 0.5;
* full-graph: GraphSAGE 3 x 256, Adam lr 0.01, dropout 0.5;
* evaluation every epoch; the epoch time is the median gap between epoch ends from epoch 3
  on (evaluation included, as each system evaluates).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from procs import HostProcesses, Job, PssSampler  # noqa: E402
from wire import WireMeter, framing  # noqa: E402

from commgnn.cluster.config import ClusterConfig, parse_rate, parse_time  # noqa: E402
from commgnn.cluster.netns import EmulatedNetwork  # noqa: E402
from commgnn.cluster.agents import torchrun_command  # noqa: E402

SYSTEMS = ("commgnn-mb", "commgnn-mb-plan", "commgnn-full", "commgnn-full-levers", "distdgl", "bnsgcn")
MB = {"layers": 2, "hidden": 256, "fanout_hop1_first": (25, 10), "batch": 1000, "lr": 0.003, "dropout": 0.5}
FULL = {"layers": 3, "hidden": 256, "lr": 0.01, "dropout": 0.5}
MODEL_FLAGS = {"mb": ["--weight-decay", "0"], "full": ["--weight-decay", "0", "--norm", "layer"]}
"""commgnn's flags that make its model the peer's: Adam without weight decay (DistDGL's
example and BNS-GCN's default), and BNS-GCN's LayerNorm between layers (its ``--norm
layer`` default) for the full-graph entries."""
LEVERS = {  # full-graph: the first layer's aggregation once, as BNS-GCN's --use-pp (exact)
    # lossless: a degree cache of a quarter of the remote rows, fetched rows as index lists or
    # bitmaps where that is smaller (bag-of-words features), the next batch fetched during this one
    # and PowerSGD (rank 2, error feedback) for the gradients
    "commgnn-mb-plan": ["--cache-ratio", "0.25", "--fetch-sparse", "--prefetch", "--grad", "powersgd"],
    "commgnn-full": ["--precompute"],
    "commgnn-full-levers": ["--precompute", "--bits", "4", "--grad", "powersgd"],
}
"""The levers of the ``-plan`` / ``-levers`` entries (fixed here; the planner's choice is
``commgnn plan``'s to make, not yet wired into this bench)."""


SYNTHETIC = {"synthetic-1m": {"num_nodes": 1_000_000, "avg_degree": 20.0}}
"""Named synthetic graphs: commgnn's generator (CSBM) at the issue's 1M nodes / 20M edges."""


def dataset_args(dataset: str) -> list[str]:
    """commgnn's flags for ``dataset`` (a name its loader knows, or one of :data:`SYNTHETIC`)."""
    if dataset in SYNTHETIC:
        return ["--dataset", "synthetic", *[a for k, v in SYNTHETIC[dataset].items()
                                            for a in (f"--synthetic-{k.replace('_', '-')}", str(v))]]
    return ["--dataset", dataset]


def default_cache() -> Path:
    return Path(os.environ.get("COMMGNN_PEERS_CACHE", Path.home() / ".cache" / "commgnn-peers"))


def export_graph(dataset: str, root: str | None, dest: Path) -> dict[str, Any]:
    """The graph commgnn's loader gives for ``dataset``, as ``dest`` (npz: x, edge_index,
    y, masks): the same nodes, edges, features and split for every system."""
    import numpy as np

    from commgnn.data import load_dataset
    from commgnn.data.config import DataConfig, SyntheticConfig

    extra: dict[str, Any] = {"root": root} if root else {}
    if dataset in SYNTHETIC:
        dataset, extra["synthetic"] = "synthetic", SyntheticConfig(**SYNTHETIC[dataset])
    cfg = DataConfig(dataset=dataset, **extra)
    d = load_dataset(cfg)
    arrays = {"x": d.x.numpy(), "edge_index": d.edge_index.numpy(), "y": d.y.numpy(),
              "train_mask": d.train_mask.numpy(), "val_mask": d.val_mask.numpy(), "test_mask": d.test_mask.numpy()}
    tmp = dest.with_suffix(".part.npz")
    np.savez(tmp, **arrays)
    tmp.rename(dest)
    return {"nodes": int(d.num_nodes), "edges": int(d.edge_index.shape[1]), "features": int(d.x.shape[1]),
            "classes": int(d.y.max()) + 1, "train": int(d.train_mask.sum())}


def commgnn_jobs(system: str, ns: argparse.Namespace, cfg: ClusterConfig, out: Path) -> list[Job]:
    if system.startswith("commgnn-mb"):
        p = MB
        model = ["--mode", "minibatch", "--fanout", ",".join(map(str, p["fanout_hop1_first"])),
                 "--batch-size", str(p["batch"]), *MODEL_FLAGS["mb"]]
    else:
        p = FULL
        model = ["--mode", "fullgraph", *MODEL_FLAGS["full"]]
    args = ["train", *dataset_args(ns.dataset), "--parts", str(cfg.world_size), "--model", "sage",
            "--layers", str(p["layers"]), "--hidden", str(p["hidden"]), "--lr", str(p["lr"]),
            "--dropout", str(p["dropout"]), "--epochs", str(ns.epochs), "--patience", "0", "--seed", str(ns.seed),
            "--no-energy", "--quiet", "--no-predictions", "--out", str(out / "run"), *model,
            *LEVERS.get(system, []), *(["--data-root", ns.data_root] if ns.data_root else [])]
    env = {"GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
    return [Job(host=h, name=f"host{h}", argv=torchrun_command(cfg, h, f"peers-{os.getpid()}", args), env=env)
            for h in range(cfg.hosts)]


def commgnn_epochs(out: Path, seen: dict[int, float]) -> None:
    """Stamp each new ``metrics.jsonl`` row with the time it was first seen."""
    path = out / "run" / "metrics.jsonl"
    if not path.exists():
        return
    now = time.monotonic()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a row being written
        seen.setdefault(int(row["epoch"]), now)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ClusterConfig(hosts=ns.hosts, ranks_per_host=1, rate_bps=parse_rate(ns.rate), delay_s=parse_time(ns.delay))
    t_start = time.monotonic()
    info = export_graph(ns.dataset, ns.data_root, out / "graph.npz") if not ns.system.startswith("commgnn") else {}
    result: dict[str, Any] = {"system": ns.system, "dataset": ns.dataset, "hosts": ns.hosts, "rate": ns.rate,
                              "delay": ns.delay, "epochs": ns.epochs, "seed": ns.seed, "graph": info,
                              **({"p_rate": ns.p_rate} if ns.system == "bnsgcn" else {})}
    with EmulatedNetwork(cfg) as net:
        links = net.host_links
        if ns.framing:
            result["framing"] = round(framing(net.prefix(0), net.prefix(1), cfg.address(1), links), 4)
        hp = HostProcesses([net.prefix(h) for h in range(cfg.hosts)], net.namespaces, out / "logs")
        epochs: dict[int, float] = {}
        accs: dict[int, tuple[float, float]] = {}
        meter_bytes: dict[int, float] = {}
        with WireMeter(links) as wire, PssSampler(net.namespaces, extra=[os.getpid()]) as pss:
            try:
                t0 = time.monotonic()
                if ns.system.startswith("commgnn"):
                    for job in commgnn_jobs(ns.system, ns, cfg, out):
                        hp.start(job)
                    names = [f"host{h}" for h in range(cfg.hosts)]
                    deadline = time.monotonic() + ns.timeout
                    codes = hp.wait(names, 0.0)
                    while time.monotonic() < deadline and any(c is None for c in codes.values()):
                        commgnn_epochs(out, epochs)
                        codes = hp.wait(names, 0.05)
                    commgnn_epochs(out, epochs)
                else:
                    import peers  # the peers' adapters, run from the peers' environment
                    codes = peers.run_peer(ns, cfg, net, hp, out, epochs, accs)
                t_end = time.monotonic()
            finally:  # every process in the namespaces, also on an error or a stop
                hp.stop()
        result["exit_codes"] = codes
        if ns.system.startswith("commgnn"):
            path = out / "run" / "metrics.jsonl"
            for line in path.read_text().splitlines() if path.exists() else []:
                row = json.loads(line)
                accs[int(row["epoch"])] = (float(row["val_acc"]), float(row["test_acc"]))
                meter_bytes[int(row["epoch"])] = float(row["total_bytes"])
    marks = sorted(epochs.items())
    ends = [t for _, t in marks]
    gaps = [b - a for a, b in zip([t0, *ends], ends)]
    # epochs 3 on (the first ones warm up); bytes as the mean over that window, from the
    # end of epoch 2 to the end of the last, so that rows seen in one poll still count
    first = 2 if len(ends) > 2 else 0
    start = ends[first - 1] if first else t0
    n = len(ends) - first
    result["epoch_time_s"] = statistics.median(gaps[first:]) if gaps else None
    result["wire_bytes_per_epoch"] = wire.between(start, ends[-1]) / n if n > 0 else None
    result["meter_bytes_per_epoch"] = (sum(meter_bytes[e] for e, _ in marks[first:]) / n
                                       if meter_bytes and n > 0 else None)
    result["wire_bytes_total"] = wire.total
    curve = [{"epoch": e, "t_s": round(t - t0, 3), "val_acc": accs.get(e, (None, None))[0],
              "test_acc": accs.get(e, (None, None))[1], "wire_bytes": round(wire.between(t0, t))} for e, t in marks]
    result["curve"] = curve
    scored = [c for c in curve if c["val_acc"] is not None]
    if scored:
        best = max(scored, key=lambda c: c["val_acc"])
        result["best_val_acc"], result["test_acc"] = best["val_acc"], best["test_acc"]
        target = ns.target_acc if ns.target_acc is not None else best["val_acc"]
        hit = [c for c in scored if c["val_acc"] >= target]
        result["time_to_target_s"] = hit[0]["t_s"] if hit else None
        result["target_acc"] = target
    result["start_to_first_epoch_s"] = round(ends[0] - t0, 2) if ends else None
    result["wall_s"] = round(t_end - t_start, 2)
    result["peak_pss_mb_sum"] = round(pss.peak_kb / 1024, 1)
    result["versions"] = versions(ns)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def versions(ns: argparse.Namespace) -> dict[str, str]:
    import torch

    import commgnn
    v = {"commgnn": getattr(commgnn, "__version__", "?"), "torch(commgnn)": torch.__version__}
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    v["commgnn_commit"] = commit
    stamp = Path(ns.cache) / "versions.json"
    if not ns.system.startswith("commgnn") and stamp.exists():
        v.update(json.loads(stamp.read_text()))
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", choices=SYSTEMS, required=True)
    ap.add_argument("--dataset", required=True, help="any graph commgnn's loader knows (name or folder)")
    shared = HERE.parents[2] / "shared" / "datasets"
    ap.add_argument("--data-root", default=os.environ.get("COMMGNN_DATA_ROOT", str(shared) if shared.is_dir() else None),
                    help="folder of staged datasets (default: $COMMGNN_DATA_ROOT or ../shared/datasets)")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="each host's link rate per direction (tc units)")
    ap.add_argument("--delay", default="0ms")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--p-rate", type=float, default=1.0, help="bnsgcn: boundary sampling rate")
    ap.add_argument("--target-acc", type=float, default=None, help="time to this validation accuracy")
    ap.add_argument("--framing", action="store_true", help="measure wire bytes per TCP payload byte first")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--cache", default=str(default_cache()), help="the peers' environments (setup.sh)")
    ap.add_argument("--out", required=True)
    ns = ap.parse_args()
    # SIGTERM (a grid stopped) unwinds like Ctrl-C: the namespaces and links are removed
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    res = run(ns)
    print(json.dumps({k: v for k, v in res.items() if k not in ("curve",)}, indent=1))
    sys.exit(0 if all(c == 0 for c in res["exit_codes"].values()) else 1)


if __name__ == "__main__":
    main()
