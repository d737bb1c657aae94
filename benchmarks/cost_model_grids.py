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
        --collectives benchmarks/results/2026-12-05-calibrations \\
        --calibrations benchmarks/results/2026-12-05-calibrations --tag grids
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
from emulated_grid import twin_dir
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


def _errors(seeds: list[Path], model: ClusterModel, twin: Path, lo: ClusterModel) -> tuple[float, float, float]:
    """Mean error (%) over seeds, links only and with the twin's residual; the residual."""
    links = statistics.mean(predict_run(s, model)["error"] for s in seeds)
    res = residual_s(twin, lo) if (twin / "summary.json").is_file() else float("nan")
    if res != res:
        return 100 * links, float("nan"), res
    full = statistics.mean(predict_run(s, model, overhead_s=res, reference=lo)["error"] for s in seeds)
    return 100 * links, 100 * full, res


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
    for ds in ns.datasets:
        for link in ns.links:
            net, runs = out / f"{ds}-{link}-net.json", out / ds / link
            if not net.is_file() or not runs.is_dir():
                continue
            model = _grafted(_load(net), donor(link))
            fresh = _load(ns.calibrations / f"{link}.json") if ns.calibrations else None
            for entry in sorted(runs.iterdir()):
                seeds = [s for s in sorted(entry.glob("s*")) if (s / "summary.json").is_file()]
                if not seeds:
                    continue
                twin = twin_dir(out, ds, link, entry.name.split("@")[0], P, ns.layers, ns.hidden)
                links, full, res = _errors(seeds, model, twin, lo)
                row = {"graph": ds, "link": link, "entry": entry.name, "seeds": len(seeds),
                       "measured epoch s": f"{statistics.mean(predict_run(s, model)['measured_epoch_s'] for s in seeds):.3f}",
                       "links only %": f"{links:+.1f}", "+ residual %": f"{full:+.1f}", "residual s": f"{res:.3f}"}
                if fresh is not None and lo_new is not None:
                    links2, full2, res2 = _errors(seeds, fresh, twin, lo_new)
                    row.update({"recalibrated: links only %": f"{links2:+.1f}",
                                "recalibrated: + residual %": f"{full2:+.1f}", "recalibrated: residual s": f"{res2:.3f}"})
                rows.append(row)
    if not rows:
        raise SystemExit(f"{out}: no grid runs with calibrations for {ns.datasets} x {ns.links}")
    full_errs = [float(r["+ residual %"]) for r in rows if r["+ residual %"] != "+nan"]
    summary = [f"With the residual, as run: {min(full_errs):+.1f}% to {max(full_errs):+.1f}% over {len(full_errs)} rows."]
    if ns.calibrations:
        errs2 = [float(r["recalibrated: + residual %"]) for r in rows if r["recalibrated: + residual %"] != "+nan"]
        summary.append(f"Recalibrated: {min(errs2):+.1f}% to {max(errs2):+.1f}%.")
    stamp = ns.stamp or datetime.date.today().isoformat()
    stem = Path(__file__).resolve().parent / "results" / f"{stamp}-cost-model{'-' + ns.tag if ns.tag else ''}"
    write_table(rows, stem, f"The cost model on the stored emulated-grid runs ({stamp})", [
        f"`python benchmarks/cost_model_grids.py` on `{out}`: {ns.hosts} emulated hosts x {ns.ranks_per_host} ranks, "
        f"GCN {ns.layers}x{ns.hidden}, every seed's run re-priced from its recorded per-pair bytes and its busiest "
        "rank's compute, epochs 2..n; error = (predicted - measured) / measured, mean over seeds. + residual: the "
        "entry's loopback twin's unexplained seconds joined by `commgnn.netmodel.predict.with_overhead`, only the "
        "links' price in excess of the loopback's overlapping it.",
        "As run: the link calibrations taken beside the runs"
        + (f", with the all-reduce, scalar all-reduce and barrier from `{ns.collectives}` (calibrated later on the "
           "same emulated cluster)" if ns.collectives else "") + "."
        + (f" Recalibrated: every calibration from `{ns.calibrations}` whole." if ns.calibrations else ""),
        *summary])
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
