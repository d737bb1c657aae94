"""Deep residual models: accuracy, halo bytes and memory per layer against depth (issue #15 §4).

Runs the ``commgnn bench`` grid ``benchmarks/deep_models_cs.toml`` (res+ GCN with 3, 7, 14
and 28 blocks on CS, 4 ranks, exact and with halo levers, 3 seeds, early stopping; see the
file for the protocol), then tabulates its runs into two dated tables under
``benchmarks/results/deep/``:

``<date>-deep-models-<dataset>``, one row per setting (mean ± std over seeds): test accuracy
at the best validation epoch, training halo bytes per epoch (forward rows and backward
gradients, all ranks) and per layer (mean over layers, and the range), the ratio of each
run's halo bytes to the exact 3-block model's and whether it stays within 2x, peak RSS of
the busiest rank, epoch time, and the activation memory a block keeps for the backward pass
on the busiest rank, without and with checkpointing
(:meth:`commgnn.models.deep.ResPlusGNN.saved_bytes_per_block`: autograd's saved tensors of
one block measured at the rank's size, which ``tests/test_deep.py`` checks against a whole
model; the rank's owned and halo rows come from the partition's report).

``<date>-deep-models-<dataset>-layers``: halo bytes per epoch of every layer (forward and
backward, mean over seeds) of each setting.

    python benchmarks/deep_models.py                         # run the grid (resumable), tabulate
    python benchmarks/deep_models.py --report-only           # tabulate what runs/bench-deep-CS holds
    python benchmarks/deep_models.py --grid G.toml --out DIR --results DIR   (another grid)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tables import write_table

from commgnn.api.bench import load_grid, read_run, run_grid, slug
from commgnn.runner.config import RunConfig
from commgnn.config import from_dict, load_toml
from commgnn.models.deep import ResPlusGNN

HERE = Path(__file__).resolve().parent
WITHIN = 2.0
"""The communication target: halo bytes at most this multiple of the exact 3-block model's."""


def _pm(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (population std over seeds, as ``commgnn bench`` reports it)."""
    if len(values) == 1:
        return f"{values[0] * scale:.{digits}f}"
    return f"{statistics.mean(values) * scale:.{digits}f} ± {statistics.pstdev(values) * scale:.{digits}f}"


def _layer_bytes(summary: dict[str, Any], layers: int) -> list[float]:
    """Training halo bytes per epoch of each layer (forward rows + backward gradients)."""
    by_layer, epochs = summary["bytes_by_layer"], max(summary["epochs_run"], 1)
    return [(by_layer["halo_fwd"][str(i)] + by_layer["halo_bwd"][str(i)]) / epochs for i in range(layers)]


def _activation_mb(cfg: RunConfig, report: dict[str, Any]) -> tuple[float, float] | None:
    """MB one block keeps for backward on the busiest rank, without and with checkpointing."""
    if cfg.model.residual != "res+":
        return None
    dtype = torch.float64 if cfg.train.dtype == "float64" else torch.float32
    ranks = list(zip(report["nodes"], report["halo_in"]))  # (owned rows, halo rows) of each rank
    no, yes = (max(ResPlusGNN.saved_bytes_per_block(replace(cfg.model, checkpoint=c), n, h, dtype=dtype)
                   for n, h in ranks) for c in (False, True))
    return no / 1e6, yes / 1e6


def tabulate(grid: str, out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(setting rows, per-layer rows, notes) from the finished runs of ``grid`` in ``out``."""
    _, axes, settings, reference = load_grid(grid)
    rows, layer_rows, notes = [], [], []
    for dataset in axes.datasets:
        stem = Path(dataset).stem
        for P in axes.parts:
            report = json.loads((out / "partitions" / f"{stem}-p{P}" / "meta.json").read_text())["report"]
            for model in axes.models:
                runs: dict[str, list[tuple[dict[str, Any], RunConfig]]] = {}
                for s in settings:
                    for seed in axes.seeds:
                        d = out / "runs" / f"{stem}-{model}-p{P}-{slug(s.name)}-s{seed}"
                        if (d / "summary.json").is_file():
                            cfg = from_dict(RunConfig, load_toml(d / "config.toml"))
                            runs.setdefault(s.name, []).append((read_run(d)[0], cfg))
                if reference not in runs:
                    notes.append(f"{stem} {model} P={P}: no finished runs of {reference!r}; skipped")
                    continue
                ref = statistics.mean(r["halo_bytes_per_epoch"] for r, _ in runs[reference])
                within = []
                for name, rs in runs.items():
                    cfg = rs[0][1]
                    L = cfg.model.layers
                    per_layer = [_layer_bytes(r, L) for r, _ in rs]
                    layer_mean = [statistics.mean(col) for col in zip(*per_layer)]
                    halo = [r["halo_bytes_per_epoch"] for r, _ in rs]
                    ratio = statistics.mean(halo) / max(ref, 1.0)
                    act = _activation_mb(cfg, report)
                    if ratio <= WITHIN and L >= 14:
                        within.append(name)
                    rows.append({
                        "dataset": stem, "setting": name, "model": model, "residual": cfg.model.residual,
                        "layers": L, "checkpoint": cfg.model.checkpoint, "seeds": len(rs),
                        "test_acc_%": _pm([r["test_acc"] for r, _ in rs], 100),
                        "best_epoch": f"{statistics.mean(r['best_epoch'] for r, _ in rs):.0f}",
                        "halo_MB_per_epoch": _pm(halo, 1e-6, 2),
                        "vs_L3_exact": f"{ratio:.2f}x",
                        f"within_{WITHIN:g}x": "yes" if ratio <= WITHIN else "no",
                        "halo_MB_per_layer": (f"{statistics.mean(layer_mean) / 1e6:.3f} "
                                              f"({min(layer_mean) / 1e6:.3f}–{max(layer_mean) / 1e6:.3f})"),
                        "peak_rss_MB": f"{statistics.mean(r['peak_rss_mb'] for r, _ in rs):.0f}",
                        "epoch_s": _pm([r["epoch_time_s"] for r, _ in rs], 1, 3),
                        "act_MB_per_layer": "—" if act is None else f"{act[0]:.2f}",
                        "act_MB_per_layer_ckpt": "—" if act is None else f"{act[1]:.2f}",
                        "act_MB_total": "—" if act is None else f"{act[cfg.model.checkpoint] * L:.1f}",
                    })
                    for i, b in enumerate(layer_mean):
                        layer_rows.append({"dataset": stem, "setting": name, "layer": i,
                                           "halo_MB_per_epoch": f"{b / 1e6:.4f}"})
                if within:
                    notes.append(f"{stem} {model} P={P}: settings with 14+ blocks within {WITHIN:g}x of "
                                 f"{reference}'s halo bytes: {', '.join(within)}.")
    return rows, layer_rows, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=str(HERE / "deep_models_cs.toml"))
    ap.add_argument("--out", default="runs/bench-deep-CS", help="bench output folder (runs are reused)")
    ap.add_argument("--results", default=str(HERE / "results" / "deep"), help="where the dated tables go")
    ap.add_argument("--report-only", action="store_true", help="tabulate finished runs, run nothing")
    ap.add_argument("--tag", default="", help="suffix of the table names (another grid on the same day)")
    ns = ap.parse_args()
    out = Path(ns.out)
    run_grid(ns.grid, out, report_only=ns.report_only)  # also writes commgnn bench's own tables in out
    rows, layer_rows, notes = tabulate(ns.grid, out)
    stem = Path(ns.results) / f"{datetime.date.today().isoformat()}-deep-models-{rows[0]['dataset'].lower()}"
    if ns.tag:
        stem = stem.with_name(f"{stem.name}-{ns.tag}")
    protocol = (f"Grid `{Path(ns.grid).name}` (protocol in the file), runs in `{out}`; gloo on CPU, the ranks "
                f"share the cores. Halo bytes: training exchanges (rows forward, gradients backward) of all "
                f"ranks per epoch; evaluation's exact exchanges are not included. `vs_L3_exact`: ratio to the "
                f"exact 3-block res+ model's halo bytes. `act_MB_per_layer`: what one block keeps for the "
                f"backward pass on the busiest rank (autograd's saved tensors, measured), `_ckpt` with "
                f"activation checkpointing (the block's input and its halo rows); `act_MB_total` = layers x "
                f"the run's own mode. Peak RSS: busiest rank, the whole process.")
    write_table(rows, stem, f"Deep residual models (res+) on {rows[0]['dataset']}: depth, levers, bytes, "
                            f"memory ({datetime.date.today()})", [protocol, *notes])
    write_table(layer_rows, stem.with_name(stem.name + "-layers"),
                f"Halo bytes per layer per epoch ({datetime.date.today()})", [protocol])
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
