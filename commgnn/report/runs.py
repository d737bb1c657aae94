"""Reading run directories and bench grids for ``commgnn report``.

:func:`load` turns a path into a :class:`Run` (``commgnn train --out``: manifest, status,
per-epoch metrics and summary) or a :class:`Grid` (``commgnn bench --out``: ``runs/``,
``results.csv``, ``grid.toml``). A run without ``summary.json`` (failed, interrupted,
running) is read from ``metrics.jsonl`` with its state. A last record cut short (a full
disk, or a run killed while writing it: a last line without its newline that is not valid
JSON) is left out with a warning (:func:`cut_record`), in any state; the records before it
are used. A missing directory, a directory that is no run or grid, or a corrupt record is
a one-line :class:`~commgnn.errors.UserError`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commgnn.errors import UserError

SUMMARY_KEYS = ("best_val_acc", "test_acc", "halo_bytes_per_epoch", "grad_bytes_per_epoch", "epoch_time_s")
"""Numbers a ``summary.json`` must have to be reported."""
RUN_FILES = ("manifest.json", "status.json", "metrics.jsonl", "summary.json")
"""A directory holding any of these is a run directory."""


@dataclass
class Run:
    path: Path
    name: str
    status: dict[str, Any]
    manifest: dict[str, Any] | None
    config: str | None
    summary: dict[str, Any] | None
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What the reader should not miss (a cut record): shown on the page and printed."""

    @property
    def state(self) -> str:
        return str(self.status.get("state", "unknown"))


@dataclass
class Grid:
    path: Path
    name: str
    runs: list[Run]
    table: list[dict[str, Any]] | None
    grid_toml: str | None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading and checking


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UserError(f"cannot read {path}: {reason}") from None


def _read_object(path: Path, what: str) -> dict[str, Any] | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path} is not a commgnn {what} (invalid JSON: {str(exc).splitlines()[0]})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a commgnn {what} (a JSON {type(value).__name__}, not an object)")
    return value


def is_num(v: Any) -> bool:
    """A real number (bools excluded)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers(obj: Any, where: str) -> dict[str, float]:
    if not isinstance(obj, dict) or not all(is_num(v) for v in obj.values()):
        raise UserError(f"{where} is not an object of numbers")
    return {str(k): float(v) for k, v in obj.items()}


def _metrics_row(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UserError(f"{where} is not a commgnn metrics record (not a JSON object)")
    if not is_num(obj.get("epoch")):
        raise UserError(f"{where} is not a commgnn metrics record (missing or non-numeric 'epoch')")
    row: dict[str, Any] = {"epoch": int(obj["epoch"])}
    for key in ("loss", "train_acc", "val_acc", "test_acc", "epoch_s"):
        v = obj.get(key)
        if v is not None and not is_num(v):
            raise UserError(f"{where} is not a commgnn metrics record (non-numeric {key!r})")
        row[key] = None if v is None else float(v)
    row["bytes"] = _numbers(obj.get("bytes", {}), f"{where}: 'bytes'")
    if "time_mean_s" in obj:
        row["time"] = _numbers(obj["time_mean_s"], f"{where}: 'time_mean_s'")
    else:  # older rows: the slowest rank's split
        row["time"] = {k: float(obj[f"{k}_s"]) for k in ("compute", "comm", "wait") if is_num(obj.get(f"{k}_s"))}
    return row


def cut_record(path: Path, text: str | None = None) -> str | None:
    """One line saying that the last record of the JSON-lines file ``path`` was cut short (a
    last line without its newline that is not valid JSON: a full disk or a kill in the middle
    of a write), naming its line and, where it can still be read, its epoch; None when the
    file ends with a whole record (or cannot be read)."""
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    if not text or text.endswith("\n"):
        return None
    last = text.rsplit("\n", 1)[-1]
    try:
        json.loads(last)
        return None  # whole, only its newline missing
    except ValueError:
        pass
    line = text.count("\n") + 1
    epoch = re.match(r'\{\s*"epoch"\s*:\s*(\d+)\s*,', last)
    what = f"line {line}" + (f", epoch {epoch.group(1)}" if epoch else "")
    return (f"{path}: the last record ({what}) was cut short (a full disk, or a run killed while "
            f"writing it); using the {line - 1} record{'s' if line != 2 else ''} before it")


def _read_metrics(path: Path, state: str) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The rows of ``metrics.jsonl``, notes, and warnings (a cut last record)."""
    text = _read_text(path)
    if text is None:
        return [], ["no metrics.jsonl"], []
    rows, notes, warnings = [], [], []
    cut = cut_record(path, text)
    lines = text.split("\n")
    if cut is not None:
        warnings.append(cut)
        lines = lines[:-1]
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{path} line {i} is not a commgnn metrics record "
                            f"(invalid JSON: {str(exc).splitlines()[0]})") from None
        rows.append(_metrics_row(obj, f"{path} line {i}"))
    return rows, notes, warnings


def _check_summary(s: dict[str, Any], path: Path) -> dict[str, Any]:
    bad = [k for k in SUMMARY_KEYS if not is_num(s.get(k))]
    if bad:
        raise UserError(f"{path} is not a commgnn run summary (missing or non-numeric {bad[0]!r})")
    pairs = s.get("bytes_by_pair", {})
    if not isinstance(pairs, dict):
        raise UserError(f"{path}: bytes_by_pair is not an object")
    sizes = set()
    for cls, m in pairs.items():
        if not (isinstance(m, list) and all(isinstance(r, list) and len(r) == len(m) and all(is_num(v) for v in r)
                                            for r in m)):
            raise UserError(f"{path}: bytes_by_pair[{cls!r}] is not a square matrix of numbers")
        sizes.add(len(m))
    if len(sizes) > 1:
        raise UserError(f"{path}: the bytes_by_pair matrices differ in size")
    layers = s.get("bytes_by_layer", {})
    if not isinstance(layers, dict):
        raise UserError(f"{path}: bytes_by_layer is not an object")
    s["bytes_by_layer"] = {str(c): _numbers(v, f"{path}: bytes_by_layer[{c!r}]") for c, v in layers.items()}
    return s


def is_run_dir(path: Path) -> bool:
    return any((path / f).is_file() for f in RUN_FILES)


def read_run(path: Path, name: str | None = None) -> Run:
    """A run directory's records, checked (one-line :class:`UserError` naming a bad file)."""
    path = Path(path)
    if not is_run_dir(path):
        raise UserError(f"{path} is not a commgnn run directory (none of {', '.join(RUN_FILES)})")
    status = _read_object(path / "status.json", "status record")
    notes = [] if status is not None else ["no status.json"]
    status = status or {"state": "complete" if (path / "summary.json").is_file() else "unknown"}
    if not isinstance(status.get("state", ""), str):
        raise UserError(f"{path / 'status.json'} is not a commgnn status record (state is not a string)")
    summary = _read_object(path / "summary.json", "run summary")
    if summary is not None:
        summary = _check_summary(summary, path / "summary.json")
    rows, more, warnings = _read_metrics(path / "metrics.jsonl", str(status.get("state")))
    run = Run(path=path, name=name or path.resolve().name, status=status,
              manifest=_read_object(path / "manifest.json", "manifest"), config=_read_text(path / "config.toml"),
              summary=summary, rows=rows, notes=notes + more, warnings=warnings)
    if run.summary is None:
        run.notes.append("no summary.json (written only when every rank finished): no bytes by "
                         "sender / receiver or by layer; figures from metrics.jsonl")
    return run


_TABLE_NUMBERS = ("test_acc_mean", "test_acc_std", "halo_bytes_per_epoch", "grad_bytes_per_epoch")


def _read_results(path: Path) -> list[dict[str, Any]] | None:
    text = _read_text(path)
    if text is None:
        return None
    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for i, r in enumerate(rows, 2):
        missing = [k for k in ("dataset", "model", "parts", "setting", *_TABLE_NUMBERS) if not r.get(k)]
        if missing:
            raise UserError(f"{path} is not a commgnn results table (line {i}: no {missing[0]!r})")
        row: dict[str, Any] = dict(r)
        try:
            for k, v in r.items():
                if k not in ("dataset", "model", "setting", "reached_exact_best_val"):
                    row[k] = None if v in ("", None) else float(v)
        except (TypeError, ValueError):
            raise UserError(f"{path} is not a commgnn results table (line {i}: {k} = {v!r})") from None
        row["parts"] = int(row["parts"])
        out.append(row)
    if not out:
        raise UserError(f"{path} is not a commgnn results table (no rows)")
    return out


def read_grid(path: Path) -> Grid:
    """A ``commgnn bench`` output folder: its runs, results table and grid file."""
    runs_dir = path / "runs"
    subdirs = sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    runs = [read_run(p) for p in subdirs if is_run_dir(p)]
    if not runs:
        raise UserError(f"{path} holds no commgnn run directories under runs/")
    grid = Grid(path=path, name=path.resolve().name, runs=runs, table=_read_results(path / "results.csv"),
                grid_toml=_read_text(path / "grid.toml"))
    if grid.table is None:
        grid.notes.append("no results.csv: tabulate the finished runs with "
                          f"`commgnn bench --grid {path / 'grid.toml'} --out {path} --report-only`")
    return grid


def load(path: Path) -> Run | Grid:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist")
    if not path.is_dir():
        raise UserError(f"{path} is not a directory (give a run directory or a `commgnn bench` output folder)")
    if is_run_dir(path):
        return read_run(path)
    if (path / "runs").is_dir():
        return read_grid(path)
    raise UserError(f"{path} is not a commgnn run directory (none of {', '.join(RUN_FILES)}) "
                    "nor a `commgnn bench` output folder (no runs/)")


# ---------------------------------------------------------------- numbers shown
