"""Accuracy against training budget, from the runs of one `commgnn bench` output.

For each setting of the grid and each epoch E of a list, the test accuracy at the best
validation epoch among epochs 1..E (what the run would have reported had it stopped at E),
as mean ± std over seeds (population std, as `commgnn bench` reports it), with its gap to
the reference setting. Writes a Markdown table and a plot of that accuracy against E.

    python benchmarks/curves.py runs/bench-grad-long-Computers --at 150,300,450,600 \
        --out benchmarks/results/grad-sync/2026-11-30-grad-sync-long-computers-budget
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def best_val_test(rows: list[dict]) -> list[float]:
    """``[epochs]``: test accuracy at the best validation epoch so far, per epoch."""
    out, best_val, test = [], -1.0, 0.0
    for r in rows:
        if r["val_acc"] > best_val:
            best_val, test = r["val_acc"], r["test_acc"]
        out.append(test)
    return out


def load(bench_dir: Path) -> dict[str, list[list[float]]]:
    """setting label (model / setting) -> one curve per seed."""
    curves: dict[str, list[list[float]]] = defaultdict(list)
    for run in sorted((bench_dir / "runs").iterdir()):
        if not (run / "summary.json").exists():
            continue  # an unfinished run
        summary = json.loads((run / "summary.json").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
        setting = run.name.split("-p", 1)[1].split("-", 1)[1].rsplit("-s", 1)[0]  # P-setting-sSEED
        curves[f"{summary['model']} / {setting}"].append(best_val_test(rows))
    return curves


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_dir", type=Path)
    ap.add_argument("--at", default="150,300,450,600", help="epochs to tabulate, comma-separated")
    ap.add_argument("--reference", default="allreduce", help="setting the gaps are measured against")
    ap.add_argument("--out", type=Path, required=True, help="output stem: STEM.md and STEM.png")
    ap.add_argument("--title", default="", help="plot title (the graph, the protocol)")
    args = ap.parse_args()
    if not (args.bench_dir / "runs").is_dir():
        print(f"curves: no runs/ under {args.bench_dir}", file=sys.stderr)
        return 2
    at = [int(e) for e in args.at.split(",")]
    curves = load(args.bench_dir)
    lines = ["| model / setting | seeds | " + " | ".join(f"epoch {e}" for e in at) + " |",
             "|---|---|" + "---|" * len(at)]
    for label, runs in curves.items():
        model = label.split(" / ")[0]
        ref = curves.get(f"{model} / {args.reference}", [])
        cells = []
        for e in at:
            accs = [100 * c[e - 1] for c in runs if len(c) >= e]
            if not accs:
                cells.append("—")
                continue
            sd = statistics.pstdev(accs)  # as commgnn bench reports it
            cell = f"{statistics.mean(accs):.2f} ± {sd:.2f}"
            ref_accs = [100 * c[e - 1] for c in ref if len(c) >= e]
            if ref_accs and not label.endswith(f"/ {args.reference}"):
                cell += f" ({statistics.mean(accs) - statistics.mean(ref_accs):+.2f})"
            cells.append(cell)
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in curves.items():
        n = min(len(c) for c in runs)
        mean = [100 * statistics.mean(c[i] for c in runs) for i in range(n)]
        ax.plot(range(1, n + 1), mean, label=f"{label} ({len(runs)} seeds)")
    ax.set_xlabel("epochs trained (one step each)")
    ax.set_ylabel("test acc. at best val. epoch so far (%)")
    ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))
    ax.grid(alpha=0.3)
    if args.title:
        ax.set_title(args.title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
