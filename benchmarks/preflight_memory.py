"""The pre-flight memory estimate against the peak memory runs really reach.

For each configuration, one ``commgnn train`` runs in a fresh interpreter (so the
launcher's own peak RSS is its own), and the table compares the estimate of
:mod:`commgnn.runner.preflight` with the measured peaks: the launcher's ``ru_maxrss`` and
every rank's (``summary.json``'s ``peak_rss_mb_by_rank``). An estimate should be an upper
bound that is not absurdly loose. Writes a dated Markdown/CSV table to benchmarks/results/memory/.

    python benchmarks/preflight_memory.py
    python benchmarks/preflight_memory.py --runs RUN_DIR ...   # runs already made

With ``--runs`` it reads finished run directories (for example those of
``benchmarks/fullgraph_scale.py --work``) instead, compares each rank's estimate with its
peak, and gives the ``ACTIVATION_COPIES`` each run would need for its estimate to equal its
largest rank's peak: the data that constant is fitted on.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

# (nodes, avg degree, features, model, layers, hidden, ranks)
GRID = [
    (20_000, 10, 64, "gcn", 2, 64, 2),
    (100_000, 20, 128, "gcn", 3, 128, 2),
    (100_000, 20, 128, "sage", 3, 128, 4),
    (300_000, 20, 128, "gcn", 3, 128, 4),
]

CHILD = """
import json, resource, runpy, sys
sys.argv = ["commgnn", *sys.argv[1:]]
try:  # `python -m commgnn ARGS` in this process, so that its peak RSS is this process's
    runpy.run_module("commgnn", run_name="__main__")
    rc = 0
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "launcher_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

ESTIMATE = """
import json, sys
from commgnn.runner.config import resolve_config
from commgnn.runner.preflight import estimate_for_config
from commgnn.report import read_json
run = sys.argv[1]
m = read_json(run + "/manifest.json")
est = estimate_for_config(resolve_config(run + "/config.toml", {}, {}), m["dataset"], m["partition"]["report"])
print(json.dumps({"launcher": est.launcher / 2**20, "ranks": [r / 2**20 for r in est.per_rank]}))
"""


def run_one(n: int, deg: int, f: int, model: str, layers: int, hidden: int, P: int, work: Path) -> dict:
    cfg = work / f"n{n}-{model}-p{P}.toml"
    cfg.write_text(f"[data.synthetic]\nnum_nodes = {n}\navg_degree = {deg}\nfeature_dim = {f}\n"
                   f"[model]\nname = \"{model}\"\nlayers = {layers}\nhidden = {hidden}\n"
                   f"[train]\nepochs = 3\n[output]\nquiet = true\n")
    out = work / cfg.stem
    res = subprocess.run([sys.executable, "-c", CHILD, "train", "--config", str(cfg), "--parts", str(P),
                          "--out", str(out)], capture_output=True, text=True, check=True)
    child = json.loads(res.stdout.strip().splitlines()[-1])
    est = json.loads(subprocess.run([sys.executable, "-c", ESTIMATE, str(out)], capture_output=True,
                                    text=True, check=True).stdout)
    summary = json.loads((out / "summary.json").read_text())
    measured_ranks = summary["peak_rss_mb_by_rank"]
    measured = child["launcher_mb"] + sum(measured_ranks)
    estimated = est["launcher"] + sum(est["ranks"])
    return {"nodes": n, "avg_degree": deg, "features": f, "model": model, "layers": layers,
            "hidden": hidden, "ranks": P,
            "launcher_est_mb": round(est["launcher"]), "launcher_peak_mb": round(child["launcher_mb"]),
            "rank_est_mb_max": round(max(est["ranks"])), "rank_peak_mb_max": round(max(measured_ranks)),
            "total_est_mb": round(estimated), "total_peak_mb": round(measured),
            "est_over_peak": round(estimated / measured, 2)}


def from_run(run: Path) -> dict:
    """Estimate against measurement for one finished run directory (ranks only: the
    launcher's peak is not in the run directory)."""
    from commgnn.report import read_json
    from commgnn.runner import preflight
    from commgnn.runner.config import resolve_config

    m = read_json(run / "manifest.json")
    cfg = resolve_config(str(run / "config.toml"), {}, {})
    d, rep, mc = m["dataset"], m["partition"]["report"], cfg.model
    est = preflight.estimate_for_config(cfg, d, rep)
    peaks = [mb * 2**20 for mb in read_json(run / "summary.json")["peak_rss_mb_by_rank"]]
    # the full-graph estimate is linear in the copies: each rank's gap to its peak, in per-layer rows
    b = 8 if cfg.train.dtype == "float64" else 4
    width = max(mc.hidden, d["num_classes"])
    copies: float | str = preflight.ACTIVATION_COPIES[mc.name]
    need: float | str = "—"
    old_model: int | str = "—"
    if cfg.train.mode == "minibatch":
        copies = "—"  # its own model (estimate_minibatch_memory)
        # what the full-graph model, used for mini-batch runs before 2026-12-03, estimated
        as_full = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, mode="fullgraph"))
        fg = preflight.estimate_for_config(as_full, d, rep)
        old_model = round(max(fg.per_rank) / 2**20)
    else:
        need = max(copies + (pk - e) / (mc.layers * (rep["nodes"][r] + rep["halo_in"][r]) * width * b)
                   for r, (pk, e) in enumerate(zip(peaks, est.per_rank)))
        need = round(need, 2)
    ratios = [e / p for e, p in zip(est.per_rank, peaks)]
    probed: dict[str, object] = {"rank_est_probed_mb_max": "—", "ranks_est_probed_mb_sum": "—",
                                 "est_probed_over_peak_min_rank": "—", "est_probed_over_peak_max_rank": "—"}
    if cfg.train.mode == "minibatch" and cfg.minibatch.sampler in ("neighbor", "vrgcn"):
        # what the launcher now estimates: step sizes from a sampled probe of the partitions
        from commgnn.runner.step_probe import probe_graph_from_dir
        part_dir = cfg.partition.dir or str(run / "partitions")
        pe = preflight.estimate_for_config(cfg, d, rep, probe=probe_graph_from_dir(part_dir, len(peaks)))
        pr = [e / p for e, p in zip(pe.per_rank, peaks)]
        probed = {"rank_est_probed_mb_max": round(max(pe.per_rank) / 2**20),
                  "ranks_est_probed_mb_sum": round(sum(pe.per_rank) / 2**20),
                  "est_probed_over_peak_min_rank": round(min(pr), 2), "est_probed_over_peak_max_rank": round(max(pr), 2)}
    mode = "minibatch " + cfg.minibatch.sampler if cfg.train.mode == "minibatch" else "full-graph"
    return {"run": f"{run.parent.name}/{run.name}", "nodes": d["num_nodes"], "mode": mode, "model": mc.name,
            "layers": mc.layers, "hidden": mc.hidden, "ranks": len(peaks),
            "rank_est_mb_max": round(max(est.per_rank) / 2**20), "rank_peak_mb_max": round(max(peaks) / 2**20),
            "ranks_est_mb_sum": round(sum(est.per_rank) / 2**20), "ranks_peak_mb_sum": round(sum(peaks) / 2**20),
            "est_over_peak_min_rank": round(min(ratios), 2), "est_over_peak_max_rank": round(max(ratios), 2),
            "est_over_peak_sum": round(sum(est.per_rank) / sum(peaks), 2),
            "copies_needed": need, "copies_used": copies, "fullgraph_model_rank_est_mb_max": old_model, **probed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory"))
    ap.add_argument("--runs", nargs="+", default=None, help="finished run directories to compare instead")
    ap.add_argument("--tag", default="", help="suffix of the result file names (e.g. -minibatch)")
    args = ap.parse_args()
    day = datetime.date.today().isoformat()
    out = Path(args.out)
    if args.runs:
        rows = [from_run(Path(r)) for r in args.runs]
        stem = f"{day}-preflight-fit{args.tag}"
        what = ("Each row: a finished run directory, its ranks' estimate against their measured peak RSS "
                "(MB = MiB); `copies_needed` (full-graph runs): the `ACTIVATION_COPIES` at which the largest "
                "rank's estimate equals its peak; mini-batch runs use `estimate_minibatch_memory`. "
                f"Command: `python benchmarks/preflight_memory.py --runs {' '.join(args.runs)}`.")
    else:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for spec in GRID:
                rows.append(run_one(*spec, work=Path(tmp)))
                print(rows[-1], flush=True)
        stem, what = f"{day}-preflight-memory", ("Each run: 3 epochs, synthetic CSBM, METIS. Peak = launcher "
                                                 "ru_maxrss + every rank's peak RSS (MB = MiB). Command: "
                                                 "`python benchmarks/preflight_memory.py`.")
    with open(out / f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cols = list(rows[0])
    lines = [f"# Pre-flight memory estimate vs measured peak RSS ({day})", "",
             f"Machine: {len(os.sched_getaffinity(0))} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
             f"{platform.machine()}, Python {platform.python_version()}. {what}", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / stem}.md")


if __name__ == "__main__":
    main()
