"""``commgnn.bench`` (``commgnn bench --grid FILE.toml``): a grid of ordinary runs, compared
side by side.

Grid file::

    [base]                      # any run-config tables, applied to every run
    train = { epochs = 200, patience = 50 }
    data = { root = "../shared/datasets" }

    [grid]
    datasets = ["CS", "Computers"]
    models = ["gcn", "sage"]
    parts = [8]
    seeds = [0, 1, 2]

    [[halo]]                    # one entry per halo setting ([comm.halo] keys)
    name = "exact"

    [[halo]]
    name = "4/8-bit"
    bits = { forward = 4, backward = 8 }

    [[comm]]                    # or [comm] tables (halo, grad, gossip), each replacing the
    name = "topk-0.1%"          # base's table of that name
    grad = { strategy = "topk", ratio = 0.001 }

    [[halo]]                    # an entry may also change [model] keys
    name = "maxk16"
    model = { activation = "maxk", maxk_k = 16 }

The reference every ratio is taken against is ``grid.reference`` (an entry's name); by
default the entry with the exact exchange, fp32 all-reduce and the base model, which must
then exist.

Every (dataset, model, parts, halo, seed) is a normal run with its own run directory under
``OUT/runs/``; all runs of one (dataset, parts) share one partition directory, so byte
ratios compare the same graph and partitioning. Finished runs (with a ``summary.json``) are
not run again, so an interrupted grid resumes. ``OUT`` receives ``results.csv``,
``results.md`` (mean +- std over seeds) and ``pareto.png``.

``--report-only`` tabulates what ``OUT`` already holds. A folder with no finished runs of
the grid, or with a run whose ``summary.json`` / ``metrics.jsonl`` is not a commgnn record,
is a one-line :class:`~commgnn.errors.UserError` (naming the file), not a traceback.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from commgnn.runner.config import RunConfig
from commgnn.comm.config import CommConfig, HaloConfig
from commgnn.models.config import ModelConfig
from commgnn.config import from_dict, load_toml, replace_path, to_dict
from commgnn.errors import ConfigError, UserError
from commgnn.options import OptionSet


@dataclass(frozen=True, kw_only=True)
class GridAxes:
    """``[grid]``: the axes of the grid."""

    datasets: tuple[str, ...] = ("synthetic",)
    """Dataset names (as ``--dataset``)."""
    models: tuple[str, ...] = ("gcn",)
    """Model names."""
    parts: tuple[int, ...] = (2,)
    """Rank counts."""
    seeds: tuple[int, ...] = (0,)
    """Training seeds (initialisation, dropout, sampling)."""
    reference: str | None = None
    """Name of the entry the ratios compare against (default: the exact one)."""

    def __post_init__(self) -> None:
        for name in ("datasets", "models", "parts", "seeds"):
            if not getattr(self, name):
                raise ConfigError(f"grid.{name} must not be empty")


@dataclass(frozen=True, kw_only=True)
class GridFile:
    """A bench grid file."""

    base: dict[str, Any] = field(default_factory=dict)
    """Run-config tables applied to every run."""
    grid: GridAxes = field(default_factory=GridAxes)
    """The axes."""
    halo: tuple[dict[str, Any], ...] = ()
    """Halo settings (``[comm.halo]`` keys), each with a ``name`` and optionally a ``model``
    table of ``[model]`` keys this entry changes (e.g. ``{ activation = "maxk", maxk_k = 16 }``)."""
    comm: tuple[dict[str, Any], ...] = ()
    """Whole ``[comm]`` settings (``halo``, ``grad``, ``gossip`` tables), each with a ``name``
    and optionally a ``model`` table as above."""


GRID_OPTIONS = OptionSet("bench", lambda: GridFile, (), no_flag=("",))
"""The grid file's keys (a grid is written as a file; its keys have no flags)."""


@dataclass(frozen=True)
class Setting:
    """One grid entry: its name, its whole ``[comm]`` config and the ``[model]`` keys it changes."""

    name: str
    comm: CommConfig
    model: dict[str, Any] = field(default_factory=dict)

    @property
    def is_exact(self) -> bool:
        return self.comm == CommConfig() and not self.model


def _named(entries: tuple[dict[str, Any], ...], section: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, comm keys, model keys) of each entry."""
    out = []
    for i, entry in enumerate(entries):
        entry = dict(entry)
        name = entry.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{section}[{i}] needs a name")
        model = entry.pop("model", {})
        if not isinstance(model, dict):
            raise ConfigError(f"{section}[{i}].model must be a table of [model] keys, got {model!r}")
        out.append((name, entry, model))
    return out


def load_grid(path: str) -> tuple[RunConfig, GridAxes, list[Setting], str]:
    """Base config, axes, the grid's settings and the reference entry's name."""
    grid = GRID_OPTIONS.resolve(path, {}, {})
    base = from_dict(RunConfig, grid.base, path="base")
    settings = [Setting(n, replace(base.comm, halo=from_dict(HaloConfig, e, path=f"halo[{i}]")), m)
                for i, (n, e, m) in enumerate(_named(grid.halo, "halo"))]
    base_comm = grid.base.get("comm", {})  # [[comm]] tables replace the base's tables they name
    settings += [Setting(n, from_dict(CommConfig, {**base_comm, **e}, path=f"comm[{i}]"), m)
                 for i, (n, e, m) in enumerate(_named(grid.comm, "comm"))]
    for i, s in enumerate(settings):  # each override must make a valid [model] with the base's keys
        from_dict(ModelConfig, {**to_dict(base.model), **s.model}, path=f"{s.name}.model")
    names = [s.name for s in settings]
    if not settings:
        raise ConfigError("the grid has no [[halo]] or [[comm]] entries")
    if len(set(names)) != len(names):
        raise ConfigError("grid entries must have distinct names")
    reference = grid.grid.reference
    if reference is None:
        exact = [s.name for s in settings if s.is_exact]
        if not exact:
            raise ConfigError("the grid needs an exact entry (a [[halo]] with only a name) or grid.reference")
        reference = exact[0]
    elif reference not in names:
        raise ConfigError(f"grid.reference {reference!r} names no entry (entries: {', '.join(names)})")
    return base, grid.grid, settings, reference


def bench(grid: str | Path, out: str | Path | None = None, *, report_only: bool = False) -> list[dict[str, Any]]:
    """Run (or with ``report_only``, only tabulate) every run of the grid file ``grid`` into
    ``out`` (default ``runs/bench-<grid name>``); return the table, one row per (dataset,
    model, parts, setting), also written to ``results.csv``, ``results.md`` and
    ``pareto.png``. Finished runs are not run again."""
    folder = Path(out) if out is not None else Path("runs") / f"bench-{Path(grid).stem}"
    return run_grid(str(grid), folder, report_only=report_only)


def run_grid(grid_path: str, out: Path, *, report_only: bool = False) -> list[dict[str, Any]]:
    """Run (or with ``report_only``, only tabulate) every run of the grid; return the table."""
    from commgnn.api.partition import partition_graph
    from commgnn.runner.local import train_local

    base, axes, settings, reference = load_grid(grid_path)
    rerun = f"run the grid first (`commgnn bench --grid {grid_path} --out {out}`)"
    if out.exists() and not out.is_dir():
        raise UserError(f"bench output {out} is a file, not a folder")
    if report_only and not out.is_dir():
        raise UserError(f"no finished runs in {out} (no such folder); {rerun}")
    out.mkdir(parents=True, exist_ok=True)
    if not report_only:
        (out / "grid.toml").write_text(Path(grid_path).read_text())
    rows = []
    for dataset in axes.datasets:
        for P in axes.parts:
            cfg0 = replace_path(replace_path(base, "data.dataset", dataset), "runtime.parts", P)
            pdir = out / "partitions" / f"{Path(dataset).stem}-p{P}"
            if not (pdir / "meta.json").exists() and not report_only:
                partition_graph(pdir, config=cfg0, env={})  # the grid's config as it is
            cfg0 = replace_path(cfg0, "partition.dir", str(pdir))
            for model in axes.models:
                for setting in settings:
                    name = setting.name
                    for seed in axes.seeds:
                        run_dir = out / "runs" / f"{Path(dataset).stem}-{model}-p{P}-{slug(name)}-s{seed}"
                        cfg = replace_path(replace_path(cfg0, "model.name", model), "train.seed", seed)
                        # the entry's model keys at once: each alone may not validate (maxk_k
                        # checked against the base's hidden before the entry's hidden applies)
                        cfg = replace(cfg, model=from_dict(ModelConfig, {**to_dict(cfg.model), **setting.model},
                                                           path=f"{name}.model"))
                        cfg = replace(cfg, comm=setting.comm, output=replace(cfg.output, out=str(run_dir), quiet=True))
                        if report_only:
                            if not (run_dir / "summary.json").exists():
                                continue
                        elif not _finished_with(run_dir, cfg):
                            if run_dir.exists():  # interrupted, or made with other settings: run again
                                shutil.rmtree(run_dir)
                            print(f"[bench] {run_dir.name}", flush=True)
                            t0 = time.perf_counter()
                            done = train_local(cfg)
                            print(f"[bench] {run_dir.name}: test {100 * done['test_acc']:.2f}%, best epoch "
                                  f"{done['best_epoch']} of {done['epochs_run']}, halo "
                                  f"{done['halo_bytes_per_epoch'] / 1e6:.2f} MB/epoch, "
                                  f"{time.perf_counter() - t0:.0f} s", flush=True)
                        rows.append({"dataset": dataset, "model": model, "parts": P, "setting": name,
                                     "seed": seed, "dir": run_dir})
    if not rows:
        raise UserError(f"no finished runs of this grid in {out}; {rerun}")
    table = aggregate(rows, reference=reference)
    if not table:
        raise UserError(f"no finished runs of the reference entry {reference!r} in {out}, so there is "
                        f"nothing to compare against; {rerun}")
    write_tables(table, out)
    plot_pareto(table, out / "pareto.png", traffic=traffic_axis([s.comm for s in settings]))
    return table


def traffic_axis(settings: list[CommConfig]) -> str:
    """What the settings vary, hence what ``pareto.png`` plots: ``"halo"`` bytes when only
    the halo levers differ, ``"grad"`` bytes when only gradient sync / gossip differ, else
    ``"total"``."""
    halo_varies = len({repr(c.halo) for c in settings}) > 1
    grad_varies = len({repr((c.grad, c.gossip)) for c in settings}) > 1
    if halo_varies and not grad_varies:
        return "halo"
    if grad_varies and not halo_varies:
        return "grad"
    return "total"


def _finished_with(run_dir: Path, cfg: RunConfig) -> bool:
    """A finished run of this configuration: its resolved config.toml agrees, except for
    where it was written (``output``) and where its partition was read (``partition.dir``),
    so that a grid moved or copied elsewhere is not run again."""
    if not (run_dir / "summary.json").exists():
        return False
    try:
        done = from_dict(RunConfig, load_toml(run_dir / "config.toml"))
    except ConfigError:
        return False
    return replace(done, output=cfg.output, partition=replace(done.partition, dir=cfg.partition.dir)) == cfg


def slug(name: str) -> str:
    """``name`` as a folder-name part (letters, digits, ``-_.``; anything else ``_``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _time_to_reach(metrics: list[dict[str, Any]], target: float, setup_s: float = 0.0) -> float | None:
    """The run's set-up (``setup_s``: a precomputed aggregation's exchange, a cache fill) plus
    its training seconds (slowest rank, cumulative) until val accuracy >= target."""
    t = setup_s
    for row in metrics:
        t += row["epoch_s"]
        if row["val_acc"] >= target:
            return t
    return None


SUMMARY_KEYS = ("test_acc", "best_val_acc", "halo_bytes_per_epoch", "grad_bytes_per_epoch", "epoch_time_s")
"""Numbers the tables read from each run's ``summary.json``."""
METRICS_KEYS = ("epoch_s", "val_acc")
"""Numbers the tables read from each row of a run's ``metrics.jsonl``."""


def _json_number_record(path: Path, text: str, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path} is not a commgnn {what} (invalid JSON: {exc})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a commgnn {what} (a JSON {type(value).__name__}, not an object)")
    bad = [k for k in keys if isinstance(value.get(k), bool) or not isinstance(value.get(k), (int, float))]
    if bad:
        raise UserError(f"{path} is not a commgnn {what} (missing or non-numeric {bad[0]!r})")
    return value


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A finished run's summary and per-epoch metrics, checked: a file that is missing,
    unreadable or not a commgnn record is a one-line :class:`UserError` naming it."""
    texts = {}
    for name in ("summary.json", "metrics.jsonl"):
        path = run_dir / name
        try:
            texts[name] = path.read_text()
        except FileNotFoundError:
            raise UserError(f"{path} is missing: {run_dir} is not a finished commgnn run") from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not text"
            raise UserError(f"cannot read {path}: {reason}") from None
    summary = _json_number_record(run_dir / "summary.json", texts["summary.json"], SUMMARY_KEYS, "run summary")
    metrics = [_json_number_record(run_dir / "metrics.jsonl", line, METRICS_KEYS, "metrics log")
               for line in texts["metrics.jsonl"].splitlines() if line.strip()]
    return summary, metrics


def _halo_setup(summary: dict[str, Any]) -> float | None:
    """Bytes of the one-time halo exchange before training (``precompute``'s input rows);
    None for a summary written before set-up bytes were recorded."""
    setup = summary.get("setup_bytes")
    return float(setup.get("halo_setup", 0)) if isinstance(setup, dict) else None


def _run_halo_per_epoch(summary: dict[str, Any]) -> float | None:
    """Halo bytes of the whole run, set-up included, per epoch it ran."""
    setup = _halo_setup(summary)
    if setup is None or not summary.get("epochs_run"):
        return None
    return summary["halo_bytes_per_epoch"] + setup / summary["epochs_run"]


def aggregate(runs: list[dict[str, Any]], *, reference: str) -> list[dict[str, Any]]:
    """One row per (dataset, model, parts, setting): mean/std over seeds and ratios to the reference."""
    for r in runs:
        r["summary"], r["metrics"] = read_run(r["dir"])
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["model"], r["parts"], r["setting"]), []).append(r)
    table = []
    for (dataset, model, P, setting), rs in groups.items():
        if (dataset, model, P, reference) not in groups:  # no reference runs (yet): no ratios
            continue
        exact = {e["seed"]: e for e in groups[(dataset, model, P, reference)]}
        acc = [r["summary"]["test_acc"] for r in rs]
        halo_b = [r["summary"]["halo_bytes_per_epoch"] for r in rs]
        grad_b = [r["summary"]["grad_bytes_per_epoch"] for r in rs]
        ex_g = statistics.mean(e["summary"]["grad_bytes_per_epoch"] for e in exact.values())
        ep = [r["summary"]["epoch_time_s"] for r in rs]
        ex_b = statistics.mean(e["summary"]["halo_bytes_per_epoch"] for e in exact.values())
        ex_t = statistics.mean(e["summary"]["epoch_time_s"] for e in exact.values())
        setup_b = [_halo_setup(r["summary"]) for r in rs]
        run_b = [_run_halo_per_epoch(r["summary"]) for r in rs]
        ex_run = [_run_halo_per_epoch(e["summary"]) for e in exact.values()]
        known = None not in run_b and None not in ex_run
        reach = [_time_to_reach(r["metrics"], exact[r["seed"]]["summary"]["best_val_acc"],
                                r["summary"].get("setup_s", 0.0)) for r in rs if r["seed"] in exact]
        reached = [t for t in reach if t is not None]
        table.append({
            "dataset": dataset, "model": model, "parts": P, "setting": setting, "seeds": len(rs),
            "test_acc_mean": statistics.mean(acc), "test_acc_std": statistics.pstdev(acc),
            "halo_bytes_per_epoch": statistics.mean(halo_b),
            "reduction_vs_exact": ex_b / max(statistics.mean(halo_b), 1e-9),
            "halo_setup_bytes": statistics.mean(setup_b) if None not in setup_b else None,
            "reduction_incl_setup_vs_exact": (statistics.mean(ex_run) / max(statistics.mean(run_b), 1e-9)  # type: ignore[arg-type]
                                              if known else None),
            "grad_bytes_per_epoch": statistics.mean(grad_b),
            "grad_reduction_vs_exact": ex_g / max(statistics.mean(grad_b), 1e-9),
            "epoch_time_s": statistics.mean(ep), "time_ratio_vs_exact": statistics.mean(ep) / ex_t,
            "time_to_exact_best_val_s": statistics.mean(reached) if len(reached) == len(reach) and reach else None,
            "reached_exact_best_val": f"{len(reached)}/{len(reach)}",
            "acc_delta_vs_exact_pts": 100 * (statistics.mean(acc) - statistics.mean(
                e["summary"]["test_acc"] for e in exact.values())),
        })
    return table


def write_tables(table: list[dict[str, Any]], out: Path) -> None:
    cols = list(table[0])
    with (out / "results.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(table)
    lines = ["| dataset | model | P | setting | test acc (mean ± std) | Δ vs ref (pts) | halo MB/epoch | "
             "halo reduction | halo set-up MB | reduction incl. set-up | grad MB/epoch | grad reduction | epoch ms | "
             "time ratio | s to ref's best val |",
             "|" + "---|" * 15]
    for r in table:
        reach = "—" if r["time_to_exact_best_val_s"] is None else f"{r['time_to_exact_best_val_s']:.1f}"
        setup = "?" if r["halo_setup_bytes"] is None else f"{r['halo_setup_bytes'] / 1e6:.3f}"
        incl = "?" if r["reduction_incl_setup_vs_exact"] is None else f"{r['reduction_incl_setup_vs_exact']:.1f}x"
        lines.append(f"| {r['dataset']} | {r['model']} | {r['parts']} | {r['setting']} | "
                     f"{100 * r['test_acc_mean']:.2f} ± {100 * r['test_acc_std']:.2f} | "
                     f"{r['acc_delta_vs_exact_pts']:+.2f} | {r['halo_bytes_per_epoch'] / 1e6:.3f} | "
                     f"{r['reduction_vs_exact']:.1f}x | {setup} | {incl} | {r['grad_bytes_per_epoch'] / 1e6:.4f} | "
                     f"{r['grad_reduction_vs_exact']:.1f}x | {1000 * r['epoch_time_s']:.0f} | "
                     f"{r['time_ratio_vs_exact']:.2f} | {reach} ({r['reached_exact_best_val']}) |")
    (out / "results.md").write_text("\n".join(lines) + "\n")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both fewer bytes and higher accuracy."""
    front = []
    for i, (b, a) in enumerate(points):
        if not any((b2 <= b and a2 >= a) and (b2 < b or a2 > a) for j, (b2, a2) in enumerate(points) if j != i):
            front.append(i)
    return front


_AXIS = {"halo": ("halo bytes per epoch (all ranks, log)", ("halo_bytes_per_epoch",)),
         "grad": ("gradient bytes per epoch (all ranks, log)", ("grad_bytes_per_epoch",)),
         "total": ("halo + gradient bytes per epoch (all ranks, log)", ("halo_bytes_per_epoch", "grad_bytes_per_epoch"))}


def plot_pareto(table: list[dict[str, Any]], path: Path, *, traffic: str = "total") -> None:
    """Test accuracy against ``traffic`` bytes per epoch (log), one point per setting, with
    the Pareto front of each (dataset, model, P) drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel, keys = _AXIS[traffic]
    groups = sorted({(r["dataset"], r["model"], r["parts"]) for r in table})
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for gi, g in enumerate(groups):
        rs = [r for r in table if (r["dataset"], r["model"], r["parts"]) == g]
        pts = [(max(sum(r[k] for k in keys), 1.0), 100 * r["test_acc_mean"]) for r in rs]
        color = f"C{gi % 10}"
        ax.scatter(*zip(*pts), color=color, alpha=0.6, label=f"{g[0]} {g[1]} P={g[2]}")
        front = sorted(pareto_front(pts), key=lambda i: pts[i][0])
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color=color, lw=1.5)
        for i in front:
            ax.annotate(rs[i]["setting"], pts[i], fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("traffic vs accuracy (lines: Pareto front)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)

