"""What a person sees while a run goes: a rich progress bar and a summary table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def human_bytes(n: float) -> str:
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if abs(n) < 1000 or unit == "TB":
            break
    return f"{n:.2f} {unit}"


class EpochProgress:
    """Progress bar with live loss, accuracy and bytes; silent when disabled."""

    def __init__(self, total: int, *, enabled: bool, console: Console | None = None) -> None:
        self._progress: Progress | None = None
        if enabled:
            self._progress = Progress(TextColumn("[bold]epoch"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                      console=console or Console(stderr=True), transient=False)
            self._task = self._progress.add_task("train", total=total, info="")

    def __enter__(self) -> "EpochProgress":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress:
            # An early stop ends the bar where training ended.
            done = self._progress.tasks[0].completed
            self._progress.update(self._task, total=max(done, 1))
            self._progress.stop()

    def update(self, row: dict[str, Any]) -> None:
        if not self._progress:
            return
        info = (f"loss {row['loss']:.4f}  val {row['val_acc']:.3f}  test {row['test_acc']:.3f}  "
                f"halo {human_bytes(row['halo_bytes'])}/ep  grad {human_bytes(row['grad_bytes'])}/ep")
        self._progress.update(self._task, advance=1, info=info)


def summary_table(summary: dict[str, Any]) -> Table:
    """The end-of-run table (from ``summary.json``)."""
    t = Table(title=f"commgnn: {summary['model']} on {summary['dataset']}, {summary['parts']} ranks",
              show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    part = summary["partition"]
    rows = [
        ("epochs run (best)", f"{summary['epochs_run']} ({summary['best_epoch']})"),
        ("best val acc", f"{summary['best_val_acc']:.4f}"),
        ("test acc @ best val", f"{summary['test_acc']:.4f}"),
        ("halo bytes / epoch (all ranks)", human_bytes(summary["halo_bytes_per_epoch"])),
        ("halo bytes / epoch (busiest rank)", human_bytes(summary["halo_bytes_per_epoch_max_rank"])),
        ("grad bytes / epoch", human_bytes(summary["grad_bytes_per_epoch"])),
        ("total bytes", human_bytes(summary["total_bytes"])),
        ("epoch time (median)", f"{summary['epoch_time_s'] * 1000:.1f} ms"),
        ("comm / wait time", f"{summary['comm_time_frac']:.1%} / {summary['wait_time_frac']:.1%}"),
        ("peak RSS (max rank)", f"{summary['peak_rss_mb']:.0f} MB"),
        ("edge cut / comm volume", f"{part['edge_cut']} / {part['comm_volume']}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def print_summary(summary: dict[str, Any], out_dir: str) -> None:
    console = Console(stderr=True)
    console.print(summary_table(summary))
    console.print(f"run directory: {out_dir}")
