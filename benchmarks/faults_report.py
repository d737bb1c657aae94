"""Tables and plot of the fault benchmark (``benchmarks/faults.py``): the per-trial CSV, the
Markdown summary per fault kind with the messages seen, and the exit-time plot."""

from __future__ import annotations

import argparse
import collections
import csv
import datetime as _dt
import os
import platform
import random
import shlex
import statistics
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import matplotlib
import psutil

from faults import Trial
from tables import cpu_model

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mem = psutil.virtual_memory().total / 2**30
    cpu = cpu_model()
    versions = []
    for name in ("torch", "commgnn"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} absent")
    return (f"{cores} cores{f' ({cpu})' if cpu else ''}, {mem:.1f} GiB memory, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            + ", ".join(versions))


def _num(rows: list[Trial], key: str) -> list[float]:
    return [float(getattr(r, key)) for r in rows if getattr(r, key) != ""]


def summary_table(rows: list[Trial], kinds: list[str], skipped: dict[str, str]) -> list[str]:
    lines = ["| fault | trials | ok | exit codes | exit s (median / max) | no process s (max) | "
             "left after 5 s (tracker) | message ok | rank named ok | status.json | hangs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind in kinds:
        if kind in skipped:
            lines.append(f"| {kind} | skipped: {skipped[kind]} |" + " |" * 9)
            continue
        rs = [r for r in rows if r.kind == kind and r.outcome not in ("skipped",)]
        if not rs:
            continue
        n = len(rs)
        codes = collections.Counter(r.exit_code or "none" for r in rs)
        exits = _num(rs, "exit_s")
        gone = _num(rs, "gone_s")
        states = collections.Counter(r.status for r in rs)
        ranked = [r for r in rs if r.rank_ok != ""]
        lines.append(
            f"| {kind} | {n} | {sum(r.outcome == 'ok' for r in rs)}/{n} | "
            + ", ".join(f"{c} ×{k}" for c, k in sorted(codes.items())) + " | "
            + (f"{statistics.median(exits):.2f} / {max(exits):.2f}" if exits else "—") + " | "
            + (f"{max(gone):.2f}" if gone else "—") + " | "
            + f"{sum(r.left_5s for r in rs)} ({sum(r.left_5s_tracker for r in rs)}) | "
            + f"{sum(r.message_ok for r in rs)}/{n} | "
            + (f"{sum(r.rank_ok == 'True' for r in ranked)}/{len(ranked)}" if ranked else "n/a") + " | "
            + ", ".join(f"{s} ×{k}" for s, k in sorted(states.items())) + " | "
            + f"{sum(r.outcome == 'hang' for r in rs)} |")
    return lines


def write_report(rows: list[Trial], kinds: list[str], skipped: dict[str, str], args: argparse.Namespace,
                 commgnn_cmd: str, *, tmpfs_mb: int, disk_epochs: int) -> Path:
    """``DATE-faults.csv``, ``.md`` and ``.png`` in ``args.out_dir``; returns their stem."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{_dt.date.today().isoformat()}-faults"
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        names = list(asdict(Trial(kind="", trial=0)))
        w = csv.DictWriter(fh, fieldnames=names)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    lines = [
        f"# Fault benchmark of `commgnn train` ({_dt.date.today().isoformat()})",
        "",
        f"- machine: {machine()}",
        f"- command: `{' '.join(shlex.quote(a) for a in ['python', *sys.argv])}`",
        f"- each trial: `{commgnn_cmd}`; synthetic graph of {args.nodes} nodes, 4 classes, 32 features, "
        f"GCN hidden 16, `timeout_s = 120`, patience 0, epochs 100000 (disk-full: "
        f"{disk_epochs}, so the disk pre-flight fits its {tmpfs_mb} MiB tmpfs)",
        f"- fault at a random moment: once `metrics.jsonl` has an epoch, after a further uniform "
        f"0-3 s (seed {args.seed}); trial limit {args.limit:g} s after the fault",
        "- exit s: fault to the launcher's exit; no process s: fault to no process of the job "
        "(launcher, ranks, resource tracker) alive; left after 5 s: processes of the job alive "
        "5 s after the fault (must be 0; killed afterwards), of which multiprocessing's resource "
        "tracker in brackets",
        "- expected: kill-rank exit 1, one line `commgnn: error: rank R of P failed: killed by "
        "SIGKILL` naming the killed rank, status failed; term-launcher exit 143, one line "
        "`commgnn: terminated (SIGTERM)`, status interrupted; kill-launcher exit -9, no output, "
        "no rank left; disk-full exit 1 or 2 with one `commgnn: error: ...` line; no summary.json "
        "and no traceback on stderr anywhere",
        *(["- integrity and lifecycle cases (`benchmarks/faults_integrity.py`): corrupt-checkpoint (one byte of a "
           "random rank's checkpoint of a finished 4-epoch run XOR-ed with a random value, then `train --resume "
           "RUN --epochs 6`) and malicious-checkpoint (that file replaced by a `torch.save` file whose pickle "
           "would create a marker file, its sha256 in latest.json updated to match) expect exit 2, one line "
           "naming the file, no epoch run, no marker file; early-kill-launcher (SIGKILL of `commgnn train` "
           "a uniform 0.5-10 s after its start) expects no process of the job 5 s after the kill; nan "
           "(features of 3e38) expects exit 1, one line `training diverged at epoch 1`, status failed. "
           "For these, exit s counts from the command's start (early-kill-launcher: from the kill), "
           "and the job's processes are found by a marker in their environment"]
          if set(kinds) - {"kill-rank", "term-launcher", "kill-launcher", "disk-full"} else []),
        "",
        *summary_table(rows, kinds, skipped),
        "",
    ]
    bad = [r for r in rows if r.outcome not in ("ok", "skipped")]
    messages = collections.Counter((r.kind, r.message) for r in rows if r.outcome != "skipped")
    lines += ["Messages seen (last stderr line):", ""]
    lines += [f"- {kind}: `{msg or '(none)'}` ×{k}" for (kind, msg), k in sorted(messages.items())]
    lines.append("")
    if bad:
        lines += ["Trials that missed an expectation:", ""]
        lines += [f"- {r.kind} #{r.trial}: {r.outcome} (exit {r.exit_code or 'none'}, "
                  f"`{r.message or '(no stderr)'}`{', ' + r.note if r.note else ''})" for r in bad]
        lines.append("")
    stem.with_suffix(".md").write_text("\n".join(lines))
    _plot(rows, kinds, stem.with_suffix(".png"), args.limit)
    print("\n".join(lines))
    return stem


def _plot(rows: list[Trial], kinds: list[str], path: Path, limit: float) -> None:
    shown = [k for k in kinds if any(r.kind == k and r.outcome != "skipped" for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    jitter = random.Random(0)
    labelled: set[str] = set()

    def label(text: str) -> str | None:
        if text in labelled:
            return None
        labelled.add(text)
        return text

    for i, kind in enumerate(shown):
        rs = [r for r in rows if r.kind == kind and r.outcome not in ("skipped", "no-start")]
        ok = [float(r.exit_s) for r in rs if r.exit_s != "" and r.outcome == "ok"]
        bad = [float(r.exit_s) if r.exit_s != "" else limit for r in rs if r.outcome != "ok"]
        if ok:
            ax.boxplot([ok], positions=[i], widths=0.5, showfliers=False)
        if ok:
            ax.scatter([i + jitter.uniform(-0.15, 0.15) for _ in ok], ok, s=14, color="tab:blue", alpha=0.7,
                       label=label("as expected"))
        if bad:
            ax.scatter([i + jitter.uniform(-0.15, 0.15) for _ in bad], bad, s=30, marker="x",
                       color="tab:red", label=label(f"missed an expectation (hang: plotted at {limit:.0f} s)"))
    ax.set_xticks(range(len(shown)), shown)
    ax.set_ylabel("fault to launcher exit (s)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")
    if labelled:
        ax.legend(fontsize=8)
    ax.set_title("commgnn train: time from fault to launcher exit, per trial", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------
