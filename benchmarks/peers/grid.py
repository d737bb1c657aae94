"""The peers' grid: every system on every graph, host count, link and seed, one at a time
(``run.py``), then the dated tables (Markdown, CSV) and plots in
``benchmarks/results/peers/``.

    python benchmarks/peers/grid.py                         # the whole grid of issue 56
    python benchmarks/peers/grid.py --datasets CS --hosts 2 --rates 1gbit 100mbit --seeds 0
    python benchmarks/peers/grid.py --report-only            # tables and plots from the runs kept

Each entry's ``result.json`` stays under ``--work`` (an entry already there is not run
again). The tables give, per graph, hosts and link: each system's epoch time, time to the
peer's best validation accuracy and to that less 0.5 points, wire bytes per epoch, the
meter's bytes against the wire, test accuracy, memory; then the ratios the issue's
targets name. Plots: validation accuracy against time and against cumulative wire bytes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "peers"
SYSTEMS = ["commgnn-mb", "commgnn-mb-plan", "distdgl", "commgnn-full", "commgnn-full-levers",
           "bnsgcn:1.0", "bnsgcn:0.1", "bnsgcn:0.01"]
MB_SYSTEMS = {"commgnn-mb", "commgnn-mb-plan", "distdgl"}


def entry_dir(work: Path, dataset: str, hosts: int, rate: str, system: str, seed: int) -> Path:
    return work / f"{Path(dataset).name}-h{hosts}-{rate}" / f"{system.replace(':', '-p')}-s{seed}"


def run_entry(ns: argparse.Namespace, dataset: str, hosts: int, rate: str, system: str, seed: int) -> None:
    out = entry_dir(Path(ns.work), dataset, hosts, rate, system, seed)
    if (out / "result.json").exists() and _ok(json.loads((out / "result.json").read_text())):
        return
    name, _, p = system.partition(":")
    cmd = [sys.executable, str(HERE / "run.py"), "--system", name, "--dataset", dataset, "--hosts", str(hosts),
           "--rate", rate, "--epochs", str(ns.epochs_mb if system in MB_SYSTEMS else ns.epochs_full),
           "--seed", str(seed), "--out", str(out), "--cache", ns.cache, "--framing"]
    if p:
        cmd += ["--p-rate", p]
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  failed ({res.returncode}): {(res.stderr or res.stdout).strip().splitlines()[-1:]}", flush=True)


def _ok(r: dict[str, Any]) -> bool:
    return all(c == 0 for c in r.get("exit_codes", {"?": 1}).values())


def load(work: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(work.glob("*/*/result.json")):
        r = json.loads(path.read_text())
        name = path.parent.name.rsplit("-s", 1)[0]
        m = re.fullmatch(r"bnsgcn-p([\d.]+)", name)
        r["entry"] = f"bnsgcn:{m.group(1)}" if m else name
        r["path"] = str(path.parent)
        rows.append(r)
    return rows


def _time_to(curve: list[dict[str, Any]], acc: float | None) -> float | None:
    if acc is None:
        return None
    hit = [c["t_s"] for c in curve if c.get("val_acc") is not None and c["val_acc"] >= acc - 1e-12]
    return hit[0] if hit else None


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row a (graph, hosts, link, system): medians over seeds; times to the peer's
    best validation accuracy (DistDGL's for mini-batch, BNS-GCN p=1.0's for full-graph)."""
    groups: dict[tuple[str, int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((Path(r["dataset"]).name, r["hosts"], r["rate"], r["entry"]), []).append(r)
    peer_best: dict[tuple[str, int, str, str], float] = {}
    for (d, h, rate, e), rs in groups.items():
        if e in ("distdgl", "bnsgcn:1.0"):
            vals = [r["best_val_acc"] for r in rs if r.get("best_val_acc") is not None]
            if vals:
                peer_best[(d, h, rate, "mb" if e == "distdgl" else "full")] = statistics.median(vals)
    out = []
    for (d, h, rate, e), rs in sorted(groups.items()):
        kind = "mb" if e in MB_SYSTEMS else "full"
        target = peer_best.get((d, h, rate, kind))

        def med(key: str) -> float | None:
            vals = [r[key] for r in rs if r.get(key) is not None]
            return statistics.median(vals) if vals else None

        t_best = [t for r in rs if (t := _time_to(r["curve"], target)) is not None]
        t_less = [t for r in rs if (t := _time_to(r["curve"], None if target is None else target - 0.005)) is not None]
        meter, wire, framing = med("meter_bytes_per_epoch"), med("wire_bytes_per_epoch"), med("framing")
        out.append({
            "graph": d, "hosts": h, "link": rate, "system": e, "seeds": len(rs),
            "epoch_s": med("epoch_time_s"), "test_acc": med("test_acc"), "best_val_acc": med("best_val_acc"),
            "peer_best_val": target,
            "t_to_peer_best_s": statistics.median(t_best) if len(t_best) == len(rs) else None,
            "t_to_peer_best_less_0.5_s": statistics.median(t_less) if len(t_less) == len(rs) else None,
            "wire_MB_per_epoch": None if wire is None else wire / 1e6,
            "meter_x_framing_over_wire": None if meter is None or not wire else meter * (framing or 1) / wire,
            "start_s": med("start_to_first_epoch_s"), "peak_pss_MB": med("peak_pss_mb_sum"),
        })
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write(rows: list[dict[str, Any]], summary: list[dict[str, Any]], failed: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{datetime.date.today()}-peers"
    keys = list(summary[0]) if summary else []
    with open(stem.with_suffix(".csv"), "w") as f:
        f.write(",".join(keys) + "\n")
        for s in summary:
            f.write(",".join(_fmt(s[k]) for k in keys) + "\n")
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    versions = next((r["versions"] for r in rows if "dgl" in r.get("versions", {})), rows[0]["versions"] if rows else {})
    lines = [f"# commgnn beside DistDGL and BNS-GCN ({datetime.date.today()})", "",
             f"Machine: {cpu or platform.processor()}, {subprocess.os.cpu_count()} cores; every host an emulated "
             "namespace on this one machine (benchmarks/peers/README.md says what each number is).",
             f"Versions: {json.dumps(versions)}", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(s[k]) for k in keys) + " |" for s in summary]
    lines += ["", "Commands: " + "; ".join(sorted({f"python benchmarks/peers/run.py --system {r['system']} "
                                                   f"--dataset {r['dataset']} --hosts {r['hosts']} --rate {r['rate']}"
                                                   f" --epochs {r['epochs']} --seed {r['seed']}"
                                                   + (f" --p-rate {r['entry'].split(':')[1]}" if ":" in r["entry"] else "")
                                                   for r in rows}))]
    if failed:
        lines += ["", "Entries that failed (their logs are beside their result.json):", *[f"- {f}" for f in failed]]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(rows, stem)
    return stem.with_suffix(".md")


def plot(rows: list[dict[str, Any]], stem: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cells = sorted({(Path(r["dataset"]).name, r["hosts"], r["rate"]) for r in rows})
    for d, h, rate in cells:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        for r in rows:
            if (Path(r["dataset"]).name, r["hosts"], r["rate"]) != (d, h, rate) or r["seed"] != 0:
                continue
            c = [x for x in r["curve"] if x.get("val_acc") is not None]
            a.plot([x["t_s"] for x in c], [x["val_acc"] for x in c], label=r["entry"])
            b.plot([x["wire_bytes"] / 1e6 for x in c], [x["val_acc"] for x in c], label=r["entry"])
        a.set_xlabel("seconds from start"), b.set_xlabel("wire MB (cumulative)")
        a.set_ylabel("validation accuracy"), b.set_xscale("log")
        b.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        a.legend(fontsize=7)
        fig.suptitle(f"{d}, {h} hosts, {rate}")
        fig.tight_layout()
        fig.savefig(f"{stem}-{d}-h{h}-{rate}.png", dpi=90)
        plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", nargs="+", default=["CS", "Physics", "Computers", "synthetic-1m"])
    ap.add_argument("--hosts", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    ap.add_argument("--systems", nargs="+", default=SYSTEMS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs-mb", type=int, default=10)
    ap.add_argument("--epochs-full", type=int, default=200)
    ap.add_argument("--work", default="/tmp/commgnn-peers")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "commgnn-peers"))
    ap.add_argument("--report-only", action="store_true")
    ns = ap.parse_args()
    if not ns.report_only:
        for d in ns.datasets:
            for h in ns.hosts:
                for rate in ns.rates:
                    for seed in ns.seeds:
                        for s in ns.systems:
                            run_entry(ns, d, h, rate, s, seed)
    rows = load(Path(ns.work))
    good = [r for r in rows if _ok(r)]
    failed = [f"{r['path']} (exit codes {r.get('exit_codes')})" for r in rows if not _ok(r)]
    print("wrote", write(good, summarise(good), failed))


if __name__ == "__main__":
    main()
