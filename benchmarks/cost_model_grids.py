"""Re-price stored emulated-grid runs with the current cost model: links only, and with
each entry's loopback residual (the library's whole prediction).

Reads what `benchmarks/emulated_grid.py --residual` left in its ``--out`` folder: every
entry's seed runs (``{DS}/{link}/{entry}/s*``), the link calibrations taken beside them
(``{DS}-{link}-net.json``), the loopback calibration and the loopback twins. No training.
Two models per row, side by side:

* ``as run``: the calibration files taken beside the runs. Files written before the
  all-reduce was calibrated price all-reduces and barriers as rings over the links; with
  ``--collectives DIR`` they take ``allreduce``, ``scalar_allreduce_s`` and ``barrier_s``
  from ``DIR/{link}.json`` (and ``DIR/loopback.json`` for the twins' link), calibrated
  later on the same emulated cluster;
* ``recalibrated`` (with ``--calibrations DIR``): every file from ``DIR`` whole.

    python benchmarks/cost_model_grids.py --out runs/bench-emulated \\
        --collectives benchmarks/results/cost-model/2026-12-05-calibrations \\
        --calibrations benchmarks/results/cost-model/2026-12-05-calibrations --tag grids
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from commgnn.netmodel import ClusterModel
from commgnn.netmodel.predict import predict_run, residual_s
from emulated_grid import TWIN_EPOCHS, twin_dir
from tables import write_table

COLLECTIVES = ("allreduce", "scalar_allreduce_s", "barrier_s")


def _load(path: Path) -> ClusterModel:
    return ClusterModel.from_dict(json.loads(path.read_text()))


def _grafted(model: ClusterModel, donor: Path | None) -> ClusterModel:
    """``model`` with the donor calibration's collectives (unchanged without a donor)."""
    if donor is None:
        return model
    d = _load(donor)
    return replace(model, **{k: getattr(d, k) for k in COLLECTIVES},
                   fits={**model.fits, **{k: d.fits[k] for k in ("all_reduce", "scalar_all_reduce", "barrier")
                                          if k in d.fits}})


def _errors(seeds: list[Path], model: ClusterModel, twin: Path, lo: ClusterModel) -> dict[str, Any]:
    """Mean measured epoch and errors (%) over ``seeds``, links only and with the twin's
    residual (None without a twin), and the residual."""
    plain = [predict_run(s, model) for s in seeds]
    out = {"measured": statistics.mean(p["measured_epoch_s"] for p in plain),
           "links": 100 * statistics.mean(p["error"] for p in plain), "full": None, "residual": None}
    if (twin / "summary.json").is_file():
        res = residual_s(twin, lo)
        out["full"] = 100 * statistics.mean(predict_run(s, model, overhead_s=res, reference=lo)["error"] for s in seeds)
        out["residual"] = res
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1f}"


def _sec(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/bench-emulated", help="the grid's folder (emulated_grid.py --out)")
    ap.add_argument("--datasets", nargs="+", default=["CS", "Computers"])
    ap.add_argument("--links", nargs="+", default=["100mbit", "1gbit", "100mbit+5ms"])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--collectives", type=Path, help="folder of later calibrations ({link}.json, loopback.json) "
                                                     "whose collectives join the files taken beside the runs")
    ap.add_argument("--calibrations", type=Path, help="folder of later calibrations priced whole, side by side")
    ap.add_argument("--twin-epochs", dest="twin_epochs", type=int, default=TWIN_EPOCHS,
                    help="epochs of the loopback twins to read (emulated_grid.py --twin-epochs)")
    ap.add_argument("--legacy-twins", dest="legacy_twins", action="store_true",
                    help="read the twins trained without energy measurement (emulated_grid.py --legacy-twins)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--stamp", default="")
    ns = ap.parse_args()
    out, P = Path(ns.out), ns.hosts * ns.ranks_per_host
    if not out.is_dir():
        raise SystemExit(f"{out}: no such grid folder")
    donor = (lambda name: ns.collectives / f"{name}.json") if ns.collectives else (lambda name: None)
    lo = _grafted(_load(out / f"loopback-parts{P}-net.json"), donor("loopback"))
    lo_new = _load(ns.calibrations / "loopback.json") if ns.calibrations else None
    rows: list[dict[str, Any]] = []
    full: list[float | None] = []
    full2: list[float | None] = []
    for ds in ns.datasets:
        for link in ns.links:
            net, runs = out / f"{ds}-{link}-net.json", out / ds / link
            if not net.is_file() or not runs.is_dir():
                continue
            model = _grafted(_load(net), donor(link))
            redo = ns.calibrations / f"{link}.json" if ns.calibrations else None
            fresh = _load(redo) if redo is not None and redo.is_file() else None  # "—" where none was taken
            for entry in sorted(runs.iterdir()):
                seeds = [s for s in sorted(entry.glob("s*")) if (s / "summary.json").is_file()]
                if not seeds:
                    continue
                twin = twin_dir(out, ds, link, entry.name.split("@")[0], P, ns.layers, ns.hidden, ns.twin_epochs,
                                legacy=ns.legacy_twins)
                e = _errors(seeds, model, twin, lo)
                row = {"graph": ds, "link": link, "entry": entry.name, "seeds": len(seeds),
                       "measured epoch s": f"{e['measured']:.3f}", "links only %": _pct(e["links"]),
                       "+ residual %": _pct(e["full"]), "residual s": _sec(e["residual"])}
                full.append(e["full"])
                if fresh is not None and lo_new is not None:
                    e2 = _errors(seeds, fresh, twin, lo_new)
                    row.update({"recalibrated: links only %": _pct(e2["links"]),
                                "recalibrated: + residual %": _pct(e2["full"]),
                                "recalibrated: residual s": _sec(e2["residual"])})
                    full2.append(e2["full"])
                rows.append(row)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "—") for k in cols} for r in rows]
    if not rows:
        raise SystemExit(f"{out}: no grid runs with calibrations for {ns.datasets} x {ns.links}")
    done = [x for x in full if x is not None]
    summary = [f"With the residual, as run: {min(done):+.1f}% to {max(done):+.1f}% over {len(done)} rows."
               if done else "No loopback twins: no residual."]
    done2 = [x for x in full2 if x is not None]
    if done2:
        summary.append(f"Recalibrated: {min(done2):+.1f}% to {max(done2):+.1f}%.")
    stamp = ns.stamp or datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / "cost-model" / f"{stamp}-cost-model{'-' + ns.tag if ns.tag else ''}"
    write_table(rows, stem, f"The cost model on the stored emulated-grid runs ({stamp})", [
        f"`python benchmarks/cost_model_grids.py` on `{out}`: {ns.hosts} emulated hosts x {ns.ranks_per_host} ranks, "
        f"GCN {ns.layers}x{ns.hidden}, every seed's run re-priced from its recorded per-pair bytes and its busiest "
        "rank's compute, epochs 2..n; error = (predicted - measured) / measured, mean over seeds. + residual: the "
        f"entry's loopback twin's ({ns.twin_epochs} epochs, the first left out) unexplained seconds joined by "
        "`commgnn.netmodel.predict.with_overhead`, only the "
        "links' price in excess of the loopback's overlapping it.",
        "As run: the link calibrations taken beside the runs"
        + (f", with the all-reduce, scalar all-reduce and barrier from `{ns.collectives}` (calibrated later on the "
           "same emulated cluster)" if ns.collectives else "") + "."
        + (f" Recalibrated: every calibration from `{ns.calibrations}` whole." if ns.calibrations else ""),
        *summary])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
