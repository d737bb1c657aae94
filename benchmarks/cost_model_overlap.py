"""How the loopback residual joins the links' price: three rules on recorded validation rows.

Reads the result tables `benchmarks/cost_model.py --reference loopback` wrote (one row per
emulated run: its measured epoch, the busiest rank's compute, the calibrated links' price of
its bytes and the loopback twin's residual) and prices each row three ways
(`commgnn.netmodel.predict.with_overhead`):

* added: ``compute + link + residual`` (no overlap: an upper bound);
* max: ``compute + max(link, residual)`` (full overlap: a lower bound);
* midpoint: ``compute + link + residual - min(link, residual) / 2`` (the library's rule until
  2026-12-05; since then, with the reference link's model at hand, only the link's price in
  excess of the reference's takes the place of ``link`` inside ``min``).

``--fit`` tables are the rows the rule was chosen on; ``--held-out`` tables are rows run
after it was fixed. The entries must not be pipelined (their link price is all exposed),
which holds for exact, tf+q4 and precompute+tf.

    python benchmarks/cost_model_overlap.py \
        --fit benchmarks/results/cost-model/2026-12-0[34]-cost-model-levers-*.csv \
        --held-out benchmarks/results/cost-model/2026-12-04-cost-model-heldout-*.csv --tag overlap
"""

from __future__ import annotations

import argparse
import csv
import datetime
from pathlib import Path

from commgnn.netmodel.predict import OVERLAP, with_overhead
from tables import write_table

RULES = {"added": 0.0, "max": 1.0, "midpoint": OVERLAP}
NOT_PIPELINED = {"exact", "tf+q4", "precompute+tf"}


def _graph(path: Path) -> str:
    """The graph a table measured: its rows do not say, its tag does (``-computers`` or CS)."""
    name = path.stem.lower()
    return "Computers" if "computers" in name else "CS"


def rows_of(paths: list[Path], split: str) -> list[dict[str, str]]:
    """One output row per input row: its configuration and each rule's error, %."""
    out = []
    for path in paths:
        for r in csv.DictReader(path.open()):
            entry = r.get("entry", "exact")
            if entry not in NOT_PIPELINED:
                raise SystemExit(f"{path}: entry {entry!r} may be pipelined; this check prices exposed links only")
            measured, compute = float(r["measured_epoch_s"]), float(r["compute_s"])
            link, res = float(r["comm_predicted_s"]), float(r["loopback_residual_s"])
            row = {"split": split, "table": path.stem, "graph": _graph(path),
                   "hosts": f"{r['hosts']}x{r['ranks_per_host']}", "link": r["link"], "entry": entry,
                   "measured_epoch_s": f"{measured:.3f}", "compute_s": f"{compute:.3f}",
                   "link_s": f"{link:.3f}", "residual_s": f"{res:.3f}",
                   "error_links_only_%": f"{100 * (compute + link - measured) / measured:+.1f}"}
            for name, o in RULES.items():
                row[f"error_{name}_%"] = f"{100 * (compute + with_overhead(link, res, o) - measured) / measured:+.1f}"
            out.append(row)
    return out


def summary(rows: list[dict[str, str]]) -> list[str]:
    """A line per split and rule: the error range and how many rows lie beyond 20%."""
    lines = []
    for split in dict.fromkeys(r["split"] for r in rows):
        sel = [r for r in rows if r["split"] == split]
        parts = []
        for name in ("links_only", *RULES):
            e = [float(r[f"error_{name}_%"]) for r in sel]
            parts.append(f"{name} {min(e):+.1f}..{max(e):+.1f}% ({sum(abs(x) > 20 for x in e)} beyond 20%, "
                         f"mean |error| {sum(map(abs, e)) / len(e):.1f}%)")
        lines.append(f"{split} ({len(sel)} rows): " + "; ".join(parts) + ".")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", nargs="+", type=Path, required=True, help="tables the rule was chosen on")
    ap.add_argument("--held-out", nargs="*", type=Path, default=[], help="tables run after the rule was fixed")
    ap.add_argument("--tag", default="overlap")
    ns = ap.parse_args()
    rows = rows_of(ns.fit, "fit") + rows_of(ns.held_out, "held out")
    stamp = datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "cost-model" / f"{stamp}-cost-model-{ns.tag}"
    write_table(rows, stem, f"Cost model: joining the loopback residual to the links' price ({stamp})",
                ["Each row is one emulated run (`benchmarks/cost_model.py --reference loopback`). Rules: links only = "
                 "compute + link; added = compute + link + residual (no overlap, an upper bound); max = compute + "
                 "max(link, residual) (full overlap, a lower bound); midpoint = compute + link + residual - "
                 "min(link, residual) / 2 (the library's rule, `commgnn.netmodel.predict.with_overhead`). "
                 "fit: the rows the rule was chosen on; held out: rows run after it was fixed.", *summary(rows)])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
