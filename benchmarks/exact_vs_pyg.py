"""Benchmark: commgnn exact mode at P = 1, 2, 4 against single-process PyG.

For each graph (Cora, Coauthor CS, Amazon Computers, a synthetic 200k-node CSBM) it runs

* PyG: the same architecture from PyG's own layers (``ReferenceGNN``) on the whole graph,
  one process, same optimiser, epochs and evaluation protocol (test accuracy at the best
  validation epoch; an epoch = one training step + one exact evaluation forward);
* ``commgnn train`` with P = 1, 2, 4 local gloo ranks (METIS, exact halo exchange),

each in its own process (so peak RSS is that run's own), and writes a dated Markdown and
CSV table plus a plot into ``benchmarks/results/halo/``. Epoch-time ratios are against the PyG
run of the same graph in the same invocation, on the same machine.

    python benchmarks/exact_vs_pyg.py --data-root ../shared/datasets [--quick]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tables import cpu_model

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "halo"

GRAPHS = {
    # name: (dataset, extra TOML for [data], epochs)
    "Cora": ("Cora", "", 200),
    "CS": ("CS", "", 100),
    "Computers": ("Computers", "", 100),
    "synthetic-200k": ("synthetic", "[data.synthetic]\nnum_nodes = 200000\nnum_classes = 10\n"
                       "avg_degree = 10.0\nhomophily = 0.7\nfeature_dim = 128\n", 30),
}
MODEL = "[model]\nname = \"gcn\"\nlayers = 2\nhidden = 64\ndropout = 0.5\n"


def run_config(dataset: str, extra: str, epochs: int, root: str, cache: str) -> str:
    return (f"[data]\ndataset = \"{dataset}\"\nroot = \"{root}\"\ncache_dir = \"{cache}\"\n{extra}"
            f"{MODEL}[train]\nepochs = {epochs}\npatience = 0\n[output]\nquiet = true\n")


def pyg_baseline(config_path: str) -> dict:
    """Run in a child process: PyG single-process training under the same config."""
    import torch
    import torch.nn.functional as F

    from commgnn.runner.config import RunConfig
    from commgnn.config import from_dict, load_toml
    from commgnn.data import load_dataset
    from commgnn.models import ReferenceGNN

    cfg = from_dict(RunConfig, load_toml(config_path))
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = ReferenceGNN(cfg.model, data.x.shape[1], data.num_classes_total)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    masks = (data.train_mask, data.val_mask, data.test_mask)
    best_val, test_at_best, times = -1.0, 0.0, []
    for _ in range(cfg.train.epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(1)
        accs = [float((pred[m] == data.y[m]).float().mean()) for m in masks]
        times.append(time.perf_counter() - t0)
        if accs[1] > best_val:
            best_val, test_at_best = accs[1], accs[2]
    return {"test_acc": test_at_best, "best_val_acc": best_val, "epoch_time_s": statistics.median(times),
            "halo_bytes_per_epoch": 0, "grad_bytes_per_epoch": 0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def machine() -> str:
    cpu = cpu_model("unknown CPU")
    import torch

    return (f"{platform.node()}: {cpu}, {len(os.sched_getaffinity(0))} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM, "
            f"Python {platform.python_version()}, torch {torch.__version__}, gloo on CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", default=os.environ.get("COMMGNN_DATA_ROOT", str(HERE.parents[1] / "shared" / "datasets")))
    ap.add_argument("--graphs", nargs="*", default=list(GRAPHS))
    ap.add_argument("--parts", nargs="*", type=int, default=[1, 2, 4])
    ap.add_argument("--quick", action="store_true", help="5 epochs each (a smoke run, not for the table)")
    ap.add_argument("--pyg-baseline", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pyg_baseline:
        print(json.dumps(pyg_baseline(args.pyg_baseline)))
        return

    work = Path(tempfile.mkdtemp(prefix="commgnn-bench-"))
    cache = work / "cache"
    rows = []
    for name in args.graphs:
        dataset, extra, epochs = GRAPHS[name]
        epochs = 5 if args.quick else epochs
        cfg_path = work / f"{name}.toml"
        cfg_path.write_text(run_config(dataset, extra, epochs, args.data_root, str(cache)))
        res = subprocess.run([sys.executable, __file__, "--pyg-baseline", str(cfg_path)],
                             capture_output=True, text=True, check=True)
        base = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append({"graph": name, "system": "PyG (1 process)", "parts": 1, **base})
        print(f"{name:15s} PyG       test {base['test_acc']:.4f}  epoch {base['epoch_time_s'] * 1e3:8.1f} ms", flush=True)
        for P in args.parts:
            out = work / f"{name}-p{P}"
            subprocess.run([sys.executable, "-m", "commgnn", "train", "--config", str(cfg_path),
                            "--parts", str(P), "--out", str(out)], check=True)
            s = json.loads((out / "summary.json").read_text())
            rows.append({"graph": name, "system": "commgnn exact", "parts": P,
                         **{k: s[k] for k in ("test_acc", "best_val_acc", "epoch_time_s", "halo_bytes_per_epoch",
                                              "grad_bytes_per_epoch", "peak_rss_mb")},
                         "comm_volume": s["partition"]["comm_volume"]})
            print(f"{name:15s} commgnn P={P} test {s['test_acc']:.4f}  epoch {s['epoch_time_s'] * 1e3:8.1f} ms  "
                  f"halo {s['halo_bytes_per_epoch'] / 1e6:.2f} MB", flush=True)
        for r in rows:
            if r["graph"] == name:
                r["time_ratio_vs_pyg"] = r["epoch_time_s"] / base["epoch_time_s"]
    write_results(rows, machine(), args.quick)


def write_results(rows: list[dict], host: str, quick: bool) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    stem = RESULTS / f"{stamp}-exact-vs-pyg{'-quick' if quick else ''}"
    cols = ["graph", "system", "parts", "test_acc", "best_val_acc", "epoch_time_s", "time_ratio_vs_pyg",
            "halo_bytes_per_epoch", "grad_bytes_per_epoch", "peak_rss_mb", "comm_volume"]
    with open(f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = [f"# commgnn exact mode vs single-process PyG ({stamp})", "",
             f"Machine: {host}.", "",
             "GCN, 2 layers, hidden 64, dropout 0.5, Adam lr 0.01, wd 5e-4, fixed epochs (no early stop); "
             "test accuracy at the best validation epoch; epoch = training step + exact evaluation forward "
             "(median); bytes per epoch summed over ranks (training halo forward+backward; gradient ring "
             "all-reduce payload); METIS edge-cut partitions; peak RSS = max over ranks.", "",
             "| graph | system | P | test acc | epoch ms | ratio to PyG | halo MB/epoch | grad MB/epoch | peak RSS MB | comm volume C |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['system']} | {r['parts']} | {r['test_acc']:.4f} | "
                     f"{r['epoch_time_s'] * 1e3:.1f} | {r['time_ratio_vs_pyg']:.2f} | "
                     f"{r['halo_bytes_per_epoch'] / 1e6:.2f} | {r['grad_bytes_per_epoch'] / 1e6:.3f} | "
                     f"{r['peak_rss_mb']:.0f} | {r.get('comm_volume', '-')} |")
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(rows, f"{stem}.png")
    print(f"wrote {stem}.md, .csv, .png")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = list(dict.fromkeys(f"{r['system'].split()[0]} P={r['parts']}" for r in rows))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        sel = [next((r for r in rows if r["graph"] == g and f"{r['system'].split()[0]} P={r['parts']}" == label), None)
               for g in graphs]
        xs = [j + i * width for j in range(len(graphs))]
        axes[0].bar(xs, [r["time_ratio_vs_pyg"] if r else 0 for r in sel], width, label=label)
        axes[1].bar(xs, [r["test_acc"] if r else 0 for r in sel], width, label=label)
    for ax, title in zip(axes, ("epoch time / PyG epoch time", "test accuracy")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(graphs))], graphs)
        ax.set_title(title)
    axes[0].axhline(1.0, color="k", lw=0.5)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
