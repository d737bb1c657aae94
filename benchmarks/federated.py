"""Federated graph learning: accuracy, worst client, uplink bytes and rounds to target for
local-only, FedAvg, FedProx, secure aggregation, client-level DP and compressed uplinks,
against centralised training of the same model.

Protocol (every entry): a 2-layer GCN (hidden 64, dropout 0.5), clients take 4 full-batch
SGD steps (lr 0.25, weight decay 5e-4) per round, 200 rounds (at 100, FedAvg's and the
embedding runs' validation accuracy was still rising on Cora), all clients every round,
evaluation every 5 rounds, test accuracy at the best validation round; stratified 60/20/20
masks (FederatedScope-GNN's protocol), cross-client edges dropped. ``central`` trains
the same model on the whole graph with the same 800 steps; ``local`` trains each client
alone; ``emb8`` keeps the cross-client edges: each round the owners send their boundary
nodes' 8-bit embeddings for both layers (``d^-1/2 x W1`` and ``d^-1/2 h W2``), counted
as embedding bytes (client to client), not uplink. ``fedavg+neighgen`` first trains a
FedSage+-style missing-neighbour generator (20 FedAvg rounds of 10 Adam steps, 15% of each
client's nodes hidden; its updates count as uplink) and mends every client's subgraph. Compressed uplinks: rank-r projections of each weight
matrix on a shared random basis (error feedback at the clients), values at b bits, summed
in a ring of b + ceil(log2 n) bits under SecAgg. DP is client-level (clip 1, noise at the clients, RDP accounting with opacus,
delta 1e-5), under secure aggregation; its noise (and the embeddings' rounding) is drawn from
the run's seeded generators (``dp.reproducible_noise``) so that every run repeats; a
deployment keeps the default secret seeds, which change no accuracy in distribution. One process plays server and clients
(``runtime.parts = 1``; the multi-rank transport gives identical results, tested), one
thread. Bytes are each message's size on the wire: uplink = everything a client sends
to the server (masked updates plus the key, share and unmasking messages under SecAgg).

"vs fedavg fp32": total uplink bytes against plain FedAvg's (FedAvg + SecAgg's where plain
FedAvg was not run; its 32-bit fixed point costs the same 4 bytes a coordinate plus the
masking messages).

Rounds to target: the first evaluated round whose test accuracy reaches the central run's
(same seed) minus one point; '-' if never within the rounds.

    python benchmarks/federated.py --datasets Cora --clients 5 --splits louvain
    python benchmarks/federated.py --report-only      # one table of every finished run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import multiprocessing
import json
import re
import statistics
from pathlib import Path
from typing import Any

import torch

from commgnn.data.config import DataConfig
from commgnn.federated.config import FedConfig, FederateConfig, FedRuntimeConfig, SplitConfig, UplinkConfig
from commgnn.federated.dp import DPConfig
from commgnn.federated.engine import Federation
from commgnn.federated.neighgen import NeighGenConfig
from commgnn.federated.secagg.config import SecAggConfig
from tables import write_table

SECURE = {"secagg": SecAggConfig(enabled=True)}
ENTRIES: dict[str, dict[str, Any]] = {
    "central": {"fed": {"algorithm": "central"}},
    "local": {"fed": {"algorithm": "local"}},
    "fedavg": {},
    "fedprox": {"fed": {"algorithm": "fedprox", "mu": 0.01}},
    "fedavg+secagg": dict(SECURE),
    "fedavg+secagg+emb8": {**SECURE, "fed": {"cross_edges": "embeddings", "embedding_bits": 8}},
    "dp eps=1": {**SECURE, "dp": DPConfig(epsilon=1.0, reproducible_noise=True)},
    "dp eps=4": {**SECURE, "dp": DPConfig(epsilon=4.0, reproducible_noise=True)},
    "dp eps=8": {**SECURE, "dp": DPConfig(epsilon=8.0, reproducible_noise=True)},
    "rank2 4-bit+secagg": {**SECURE, "uplink": UplinkConfig(codec="rank", rank=2, bits=4)},
    "rank2 3-bit+secagg": {**SECURE, "uplink": UplinkConfig(codec="rank", rank=2, bits=3)},
    "rank2 3-bit+secagg+k4": {"secagg": SecAggConfig(enabled=True, neighbours=4),
                              "uplink": UplinkConfig(codec="rank", rank=2, bits=3)},
    "fedavg+neighgen": {"neighgen": NeighGenConfig(enabled=True)},
}


def config(dataset: str, root: str, clients: int, split: str, seed: int, entry: dict[str, Any],
           rounds: int) -> FederateConfig:
    fed = {"rounds": rounds, "eval_every": 5, "seed": seed, **entry.get("fed", {})}
    rest = {k: v for k, v in entry.items() if k != "fed"}
    rest.setdefault("dp", DPConfig(reproducible_noise=True))  # seeded noise and rounding: runs repeat
    return FederateConfig(data=DataConfig(dataset=dataset, root=root, cache_dir="/tmp/commgnn-cache"),
                          split=SplitConfig(method=split, clients=clients, seed=seed),
                          federated=FedConfig(**fed), runtime=FedRuntimeConfig(threads=1), **rest)


def run_one(path: Path, cfg: FederateConfig) -> dict[str, Any]:
    """Run (or read back) one configuration; each run's summary is kept as JSON."""
    if path.exists():
        return json.loads(path.read_text())
    out = Federation(cfg).run()
    assert out is not None
    keep = {k: v for k, v in out.items() if k not in ("fairness", "split_stats", "gate")}
    keep["worst10"] = out["fairness"].get("worst10_mean")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(keep, default=float))
    return keep


def rounds_to(curve: list[dict[str, Any]], target: float) -> int | None:
    return next((r["round"] for r in curve if r["test_acc"] >= target), None)


def _ms(values: list[float], scale: float = 100.0) -> str:
    if len(values) == 1:
        return f"{values[0] * scale:.2f}"
    return f"{statistics.mean(values) * scale:.2f} ± {statistics.stdev(values) * scale:.2f}"


def table(runs: dict[tuple[str, int, str, str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, str, str], dict[int, dict[str, Any]]] = {}
    for (ds, k, split, entry, seed), s in runs.items():
        groups.setdefault((ds, k, split, entry), {})[seed] = s
    rows = []
    for (ds, k, split, entry), by_seed in groups.items():
        central = groups.get((ds, k, split, "central"), {})
        # the fp32 reference: plain FedAvg, else FedAvg + SecAgg (its fixed point is 4 bytes too)
        fedavg = groups.get((ds, k, split, "fedavg")) or groups.get((ds, k, split, "fedavg+secagg"), {})
        accs = [s["test_acc"] for s in by_seed.values()]
        worst = [s["worst_client_acc"] for s in by_seed.values() if s["worst_client_acc"] is not None]
        up = statistics.mean(s["uplink_bytes_total"] for s in by_seed.values())
        ref_up = statistics.mean(s["uplink_bytes_total"] for s in fedavg.values()) if fedavg else 0
        delta = [s["test_acc"] - central[sd]["test_acc"] for sd, s in by_seed.items() if sd in central]
        vs_fedavg = [s["test_acc"] - fedavg[sd]["test_acc"] for sd, s in by_seed.items() if sd in fedavg]
        reach = [rounds_to(s["curve"], central[sd]["test_acc"] - 0.01) for sd, s in by_seed.items() if sd in central]
        overhead = [s["uplink_bytes_total"] - s["uplink_payload_bytes_total"] for s in by_seed.values()]
        rows.append({
            "dataset": ds, "clients": k, "split": split, "entry": entry, "seeds": len(by_seed),
            "test acc %": _ms(accs), "Δ vs central (pts)": f"{statistics.mean(delta) * 100:+.2f}" if delta else "-",
            "Δ vs fedavg (pts)": f"{statistics.mean(vs_fedavg) * 100:+.2f}" if vs_fedavg else "-",
            "worst client %": _ms(worst) if worst else "-",
            "uplink MB": f"{up / 1e6:.3f}",
            "vs fedavg fp32": f"{ref_up / up:.1f}x fewer" if up and ref_up else "-",
            "SecAgg overhead MB": f"{statistics.mean(overhead) / 1e6:.3f}" if any(overhead) else "-",
            "SecAgg s": f"{statistics.mean(s['secagg_s'] for s in by_seed.values()):.1f}",
            "embedding MB": f"{statistics.mean(s['embedding_bytes_total'] for s in by_seed.values()) / 1e6:.3f}",
            "rounds to central-1pt": "/".join("-" if r is None else str(r) for r in reach) or "-",
            "epsilon": f"{statistics.mean(s['epsilon'] for s in by_seed.values()):.2f}"
            if all("epsilon" in s for s in by_seed.values()) else "-",
            "wall s": f"{statistics.mean(s['wall_s'] for s in by_seed.values()):.0f}",
        })
    return rows


def targets(runs: dict[tuple[str, int, str, str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, clients, split): the issue's targets at a glance (means over
    the seeds both entries ran; '-' where an entry did not run)."""
    cells = sorted({k[:3] for k in runs})

    def acc(cell: tuple, entry: str) -> dict[int, float]:
        return {k[4]: s["test_acc"] for k, s in runs.items() if k[:3] == cell and k[3] == entry}

    def up(cell: tuple, entry: str) -> float | None:
        vals = [s["uplink_bytes_total"] for k, s in runs.items() if k[:3] == cell and k[3] == entry]
        return statistics.mean(vals) if vals else None

    def delta(a: dict[int, float], b: dict[int, float]) -> str:
        both = sorted(set(a) & set(b))
        return f"{statistics.mean(a[s] - b[s] for s in both) * 100:+.2f}" if both else "-"

    rows = []
    for cell in cells:
        central, fedavg = acc(cell, "central"), acc(cell, "fedavg") or acc(cell, "fedavg+secagg")
        ref = up(cell, "fedavg") or up(cell, "fedavg+secagg")
        best = "-"
        for entry in ("rank2 3-bit+secagg+k4", "rank2 3-bit+secagg", "rank2 4-bit+secagg"):
            mb = up(cell, entry)
            if mb and ref:
                d = delta(acc(cell, entry), fedavg)
                best = f"{entry}: {ref / mb:.1f}x at {d}" if best == "-" else best
        dp8 = acc(cell, "dp eps=8")
        rows.append({"dataset": cell[0], "clients": cell[1], "split": cell[2],
                     "central %": f"{statistics.mean(central.values()) * 100:.2f}" if central else "-",
                     "fedavg+secagg vs central": delta(acc(cell, "fedavg+secagg"), central),
                     "+ emb8 vs central": delta(acc(cell, "fedavg+secagg+emb8"), central),
                     "local vs central": delta(acc(cell, "local"), central),
                     "rank-2 uplink (k4: SecAgg+): x fewer bytes at pts vs fedavg": best,
                     "dp eps=8 %": f"{statistics.mean(dp8.values()) * 100:.2f}" if dp8 else "-",
                     "neighgen vs fedavg": delta(acc(cell, "fedavg+neighgen"), fedavg)})
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        mb = float(r["uplink MB"])
        if mb <= 0:
            continue
        acc = float(r["test acc %"].split(" ")[0])
        ax.scatter(mb, acc)
        ax.annotate(f"{r['dataset']} {r['clients']}c {r['entry']}", (mb, acc), fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("uplink MB over the run (log)")
    ax.set_ylabel("test accuracy %")
    ax.set_title("Federated GCN: accuracy against uplink bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def collected(folder: Path) -> dict[tuple[str, int, str, str, int], dict[str, Any]]:
    """Every finished run in ``folder``, keyed as the grid keys them (from the file names)."""
    names = {e.replace(" ", "_"): e for e in ENTRIES}
    runs = {}
    for path in sorted(folder.glob("*.json")):
        m = re.fullmatch(r"(?P<ds>[^-]+)-(?P<k>\d+)-(?P<split>[a-z]+)-(?P<entry>.+)-s(?P<seed>\d+)", path.stem)
        if m and m["entry"] in names:
            runs[(m["ds"], int(m["k"]), m["split"], names[m["entry"]], int(m["seed"]))] = json.loads(path.read_text())
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["Cora"])
    ap.add_argument("--clients", nargs="+", type=int, default=[5])
    ap.add_argument("--splits", nargs="+", default=["louvain"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--entries", nargs="+", default=list(ENTRIES))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--root", default="../shared/datasets")
    ap.add_argument("--runs", default="runs/federated", help="per-run summaries (a rerun reads them back)")
    ap.add_argument("--out", default="benchmarks/results/federated/federated")
    ap.add_argument("--tag", default="federated")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing; tabulate every finished run in --runs (every call's table does)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs side by side, one thread each (wall s then includes the sharing)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = collected(Path(args.runs))  # the table covers every finished run in --runs, not just this call's
    todo = []
    for ds in [] if args.report_only else args.datasets:
        for k in args.clients:
            for split in args.splits:
                for entry in args.entries:
                    for seed in args.seeds:
                        path = Path(args.runs) / f"{ds}-{k}-{split}-{entry.replace(' ', '_')}-s{seed}.json"
                        cfg = config(ds, args.root, k, split, seed, ENTRIES[entry], args.rounds)
                        todo.append(((ds, k, split, entry, seed), path, cfg))
    if args.jobs > 1:  # independent one-thread runs, side by side (their wall times then share the cores)
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=torch.set_num_threads,
                                                    initargs=(1,)) as pool:
            futures = {pool.submit(run_one, path, cfg): key for key, path, cfg in todo}
            for fut in concurrent.futures.as_completed(futures):
                runs[futures[fut]] = fut.result()
                print(f"[federated] {'-'.join(map(str, futures[fut]))} done", flush=True)
    for key, path, cfg in todo if args.jobs <= 1 else []:
        print(f"[federated] {path.stem}", flush=True)
        runs[key] = run_one(path, cfg)
    rows = table(runs)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    stem = Path(args.out) / f"{datetime.date.today().isoformat()}-{args.tag}"
    write_table(rows, stem, "Federated GCN: accuracy, worst client, uplink bytes",
                notes=[p.replace("\n", " ") for p in __doc__.split("\n\n")[1:4]])
    plot(rows, stem.with_suffix(".png"))
    write_table(targets(runs), stem.with_name(stem.name + "-targets"),
                "Federated GCN: the targets per dataset, clients and split",
                notes=["Differences are in points, paired by seed. Compressed: uplink bytes of fp32 FedAvg over "
                       "the compressed entry's (SecAgg's masking messages included), and its accuracy against "
                       "FedAvg's. Full table: the file without '-targets'."])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
