"""Dated result tables for the benchmark scripts: one CSV and one Markdown file per table,
the Markdown opening with a title, the machine and the protocol notes."""

from __future__ import annotations

import csv
import os
import platform
from pathlib import Path
from typing import Any, Sequence

import psutil


def cpu_model(default: str = "") -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``default`` where it is not to be had)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def machine() -> str:
    """One line naming the machine the numbers come from."""
    mem = psutil.virtual_memory().total / 2**30
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
            f"Python {platform.python_version()}")


def write_table(rows: Sequence[dict[str, Any]], stem: Path, title: str, notes: Sequence[str] = ()) -> None:
    """``stem.csv`` and ``stem.md`` from ``rows`` (the first row's keys are the columns)."""
    if not rows:
        return
    keys = list(rows[0])
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# {title}", "", f"Machine: {machine()}.", ""]
    for note in notes:
        lines += [note, ""]
    lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def time_to(rows: Sequence[dict[str, Any]], target: float, setup_s: float = 0.0) -> float | None:
    """``setup_s`` (the run's set-up before its first epoch: ``summary.json``'s ``setup_s``,
    which a precomputed aggregation or a filled cache makes longer) plus the cumulative epoch
    seconds (``epoch_s``: the slowest rank's) of ``metrics.jsonl`` rows until ``val_acc``
    first reaches ``target``; None if it never does."""
    t = setup_s
    for r in rows:
        t += r["epoch_s"]
        if r["val_acc"] >= target - 1e-12:
            return t
    return None
