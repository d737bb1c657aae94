"""Dropout on the CPU: torch's Bernoulli kernels against commgnn's 16-bit-lane mask.

Two tables, one run:

1. **Kernel**: forward + backward of ``F.dropout``, ``torch.native_dropout`` (commgnn's
   dropout until 2026-12-05) and ``commgnn.models.dropout.dropout`` at p = 0.5, one thread,
   median of ``--repeats`` calls, on the shapes training meets: a Computers rank's input
   rows (8 METIS parts), the whole Computers input, hidden rows.
2. **Training epoch**: ``commgnn train`` on Amazon Computers, 8 ranks sharing the
   machine's cores (the emulated cluster's set-up, over loopback), GCN 3x64, exact and
   precompute + transform-first, ``--epochs`` epochs; each command runs once against the
   checkout before this change (``--baseline PATH``: a git worktree at that commit, put
   first on ``PYTHONPATH``) and once against this one, alternating, ``--reps`` times. Per
   run: the mean epoch (the slowest rank's) and its compute share (``time_split``).

    python benchmarks/dropout.py --baseline /path/to/worktree-at-b193238 --data-root DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from tables import write_table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from commgnn.models.dropout import dropout  # noqa: E402

SHAPES = {"Computers rank input [1719, 767]": (1719, 767), "Computers input [13752, 767]": (13752, 767),
          "hidden rows [13752, 256]": (13752, 256), "hidden rows [100000, 64]": (100000, 64)}
KERNELS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F.dropout": lambda x: F.dropout(x, 0.5, True),
    "torch.native_dropout": lambda x: torch.native_dropout(x, 0.5, True)[0],
    "commgnn dropout": lambda x: dropout(x, 0.5, True),
}
TRAIN = ["--dataset", "Computers", "--parts", "8", "--model", "gcn", "--layers", "3", "--hidden", "64",
         "--quiet", "--no-energy", "--patience", "0", "--force"]
ENTRIES = {"exact": [], "precompute+tf": ["--precompute", "--transform-first"]}


def kernel_rows(repeats: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    rows = []
    for shape_name, shape in SHAPES.items():
        x = torch.randn(*shape, requires_grad=True)
        g = torch.randn(*shape)
        ms: dict[str, float] = {}
        for name, fn in KERNELS.items():
            def call() -> None:
                torch.autograd.grad(fn(x), x, g)
            call()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            ms[name] = 1e3 * statistics.median(times)
        for name, t in ms.items():
            rows.append({"shape": shape_name, "kernel": name, "fwd+bwd ms": f"{t:.2f}",
                         "M elements/s": f"{x.numel() / t / 1e3:.0f}",
                         "vs native_dropout": f"{ms['torch.native_dropout'] / t:.2f}x"})
    return rows


def train_once(tree: Path, flags: list[str], epochs: int, out: Path, data_root: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "COMMGNN_DATA_ROOT": data_root}
    cmd = [sys.executable, "-m", "commgnn", "train", *TRAIN, *flags, "--epochs", str(epochs), "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, cwd=tree)
    s = json.loads((out / "summary.json").read_text())
    split = s["time_split"]
    return {"epoch_s": s["epoch_time_s"], "compute_s": split["compute"], "comm_s": split["comm"],
            "alone_s": s["compute_alone_s"]}


def train_rows(ns: argparse.Namespace) -> list[dict[str, Any]]:
    trees = {"before (native_dropout)": Path(ns.baseline).resolve(), "after (16-bit lanes)": ROOT}
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(ns.reps):
            for entry, flags in ENTRIES.items():
                for label, tree in trees.items():
                    out = Path(tmp) / f"{entry}-{rep}-{'after' if tree == ROOT else 'before'}"
                    r = train_once(tree, flags, ns.epochs, out, ns.data_root)
                    print(f"[dropout] {entry} {label} rep {rep}: {r}", flush=True)
                    got.setdefault((entry, label), []).append(r)
    rows = []
    for entry in ENTRIES:
        before = statistics.mean(r["epoch_s"] for r in got[(entry, "before (native_dropout)")])
        for label in trees:
            rs = got[(entry, label)]
            ep = statistics.mean(r["epoch_s"] for r in rs)
            rows.append({"entry": entry, "code": label, "runs": len(rs), "epoch s": f"{ep:.3f}",
                         "compute s": f"{statistics.mean(r['compute_s'] for r in rs):.3f}",
                         "comm s": f"{statistics.mean(r['comm_s'] for r in rs):.3f}",
                         "compute alone s": f"{statistics.mean(r['alone_s'] for r in rs):.3f}",
                         "epoch speed-up": f"{before / ep:.2f}x"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--baseline", help="checkout before this change (a git worktree); omit: kernel table only")
    ap.add_argument("--data-root", default=os.environ.get("COMMGNN_DATA_ROOT", "../shared/datasets"))
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tag", default="")
    ns = ap.parse_args()
    day = datetime.date.today().isoformat()
    res = ROOT / "benchmarks" / "results" / "kernels"
    tag = f"-{ns.tag}" if ns.tag else ""
    write_table(kernel_rows(ns.repeats), res / f"{day}-dropout-kernel{tag}",
                "Dropout forward + backward on the CPU (p = 0.5, one thread)",
                [f"`python benchmarks/dropout.py --repeats {ns.repeats}`; median of {ns.repeats} calls; "
                 "elements/s = elements of x over the median time."])
    if ns.baseline:
        write_table(train_rows(ns), res / f"{day}-dropout-epoch{tag}",
                    "Training epochs before and after commgnn's CPU dropout (Computers, 8 ranks)",
                    [f"`commgnn train {' '.join(TRAIN)} --epochs {ns.epochs}`, + the entry's levers; "
                     f"{ns.reps} runs a cell, before and after alternating; means over runs of each run's mean "
                     "epoch (its slowest rank's), its busiest rank's compute and comm, and the busiest rank's "
                     "compute with the ranks run one at a time (`compute_alone_s`)."])


if __name__ == "__main__":
    main()
