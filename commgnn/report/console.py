"""What a person sees while a run goes: a rich progress bar (plain lines without a
terminal) and a summary table."""

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


PLAIN_LINES = 10
"""Without a terminal, progress is this many evenly spaced plain lines (plus the last epoch)."""


def plain_epochs(total: int, lines: int = PLAIN_LINES) -> set[int]:
    """Epochs (1-based) that get a plain progress line: ``lines`` evenly spaced ones, and the last."""
    if total <= 0:
        return set()
    step = total / min(lines, total)
    return {max(1, round(step * (i + 1))) for i in range(min(lines, total))} | {total}


def progress_line(epoch: int, total: int, row: dict[str, Any]) -> str:
    """One plain progress line: epoch k/N, loss, accuracies, bytes per epoch."""
    return (f"epoch {epoch}/{total}  loss {row['loss']:.4f}  val {row['val_acc']:.3f}  "
            f"test {row['test_acc']:.3f}  halo {human_bytes(row['halo_bytes'])}/ep  "
            f"grad {human_bytes(row['grad_bytes'])}/ep")


class EpochProgress:
    """Progress with live loss, accuracy and bytes; silent when disabled.

    On a terminal this is rich's bar. Otherwise (a log file, a pipe, a batch job) the bar
    would show nothing until the end, so about :data:`PLAIN_LINES` evenly spaced epochs,
    and the last one run, get a plain, flushed line each.
    """

    def __init__(self, total: int, *, enabled: bool, console: Console | None = None) -> None:
        self._progress: Progress | None = None
        self._plain: Console | None = None
        self._total = total
        self._done = 0
        self._last: tuple[int, dict[str, Any]] | None = None  # latest row not printed yet
        self._marks = plain_epochs(total)
        if not enabled:
            return
        console = console or Console(stderr=True)
        if not console.is_terminal:
            self._plain = console
            return
        self._progress = Progress(TextColumn("[bold]epoch"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                  console=console, transient=False)
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
        if self._plain and self._last is not None:  # an early stop: show where training ended
            self._write(*self._last)

    def _write(self, epoch: int, row: dict[str, Any]) -> None:
        assert self._plain is not None
        self._plain.file.write(progress_line(epoch, self._total, row) + "\n")
        self._plain.file.flush()
        self._last = None

    def skip(self, epochs: int) -> None:
        """Count ``epochs`` already done (a resumed run starts the bar where it left off)."""
        self._done += epochs
        if self._progress:
            self._progress.update(self._task, advance=epochs)

    def update(self, row: dict[str, Any]) -> None:
        self._done += 1
        if self._plain:
            epoch = int(row.get("epoch", self._done))
            self._last = (epoch, row)
            if epoch in self._marks:
                self._write(epoch, row)
            return
        if not self._progress:
            return
        info = (f"loss {row['loss']:.4f}  val {row['val_acc']:.3f}  test {row['test_acc']:.3f}  "
                f"halo {human_bytes(row['halo_bytes'])}/ep  grad {human_bytes(row['grad_bytes'])}/ep")
        self._progress.update(self._task, advance=1, info=info)


def summary_table(summary: dict[str, Any]) -> Table:
    """The end-of-run table (from ``summary.json``; keys an older summary lacks are left out).

    It says what each figure is: the halo traffic of training and of evaluation, apart, and
    the total the network carries per epoch (every class of traffic); an early stop and its
    reason; the network's energy as modelled (bytes times joules per byte), beside the
    measured CPU and RAM energy."""
    t = Table(title=f"commgnn: {summary['model']} on {summary['dataset']}, {summary['parts']} ranks",
              show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    part = summary["partition"]
    n = max(int(summary["epochs_run"]), 1)
    epochs = f"{summary['epochs_run']} ({summary['best_epoch']})"
    if summary.get("epochs_planned") is not None:
        epochs = f"{summary['epochs_run']} of {summary['epochs_planned']} ({summary['best_epoch']})"
    rows = [("epochs run (best)", epochs)]
    stop = summary.get("stopped_early")
    if isinstance(stop, dict) and stop.get("reason") == "patience":
        rows.append(("stopped early", f"after epoch {stop.get('epoch', summary['epochs_run'])}: no better "
                                      f"validation accuracy for {stop.get('patience')} epochs (train.patience)"))
    rows += [
        ("best val acc", f"{summary['best_val_acc']:.4f}"),
        ("test acc @ best val", f"{summary['test_acc']:.4f}"),
    ]
    traffic_at = len(rows)
    traffic = [("halo bytes / epoch, training (all ranks)", human_bytes(summary["halo_bytes_per_epoch"])),
               ("halo bytes / epoch (busiest rank)", human_bytes(summary["halo_bytes_per_epoch_max_rank"]))]
    if summary.get("eval_halo_bytes_per_epoch") is not None:
        traffic.append(("halo bytes / epoch, evaluation (all ranks)",
                        human_bytes(summary["eval_halo_bytes_per_epoch"])))
    rows += traffic
    rows += [
        ("grad bytes / epoch", human_bytes(summary["grad_bytes_per_epoch"])),
        ("network bytes / epoch (all traffic, all ranks)", human_bytes(summary["total_bytes"] / n)),
        ("total bytes", human_bytes(summary["total_bytes"])),
        ("epoch time (median)", f"{summary['epoch_time_s'] * 1000:.1f} ms"),
        ("comm / wait time", f"{summary['comm_time_frac']:.1%} / {summary['wait_time_frac']:.1%}"),
        *([("busiest rank, s/epoch: compute / comm / idle (overlap)",
            "{compute:.3g} / {comm:.3g} / {idle:.3g} ({overlap:.3g})".format(**summary["time_split"]))]
          if "time_split" in summary else []),
        ("peak RSS (max rank)", f"{summary['peak_rss_mb']:.0f} MB"),
        ("edge cut / comm volume", f"{part['edge_cut']} / {part['comm_volume']}"),
    ]
    if "steps_per_epoch" in summary:  # mini-batch training: its traffic is fetched features
        mb = [
            ("steps / epoch (every rank)", str(summary["steps_per_epoch"])),
            ("feature bytes / epoch (all ranks)", human_bytes(summary["feature_bytes_per_epoch"])),
            ("sampled nodes / edges per step", f"{summary['sampled_nodes_per_step']:.0f} / "
                                               f"{summary['sampled_edges_per_step']:.0f}"),
        ]
        if summary.get("cache_hit_rate") is not None:
            mb.append(("cache hit rate (offline optimum)",
                       f"{summary['cache_hit_rate']:.1%} ({summary['cache_hit_rate_optimal']:.1%})"))
        rows[traffic_at:traffic_at + 2] = mb
        rows.insert(-2, ("sample / fetch time", f"{summary['sample_time_frac']:.1%} / {summary['fetch_time_frac']:.1%}"))
    e = summary.get("energy")
    if e and e.get("measured"):
        rows.append(("energy: CPU+RAM (measured) / network (modelled)",
                     f"{(e['cpu_kwh'] + e['ram_kwh']) * 1e3:.3g} Wh / {e['network_kwh'] * 1e3:.3g} Wh "
                     f"({summary['co2_g']:.3g} g CO2)"))
    if e and e.get("network_kwh") is not None:
        where = "; these ranks shared one host (loopback)" if summary.get("one_host") else ""
        rows.append(("network energy (modelled, not measured)",
                     f"{e['network_kwh'] * 1e3:.3g} Wh = bytes x {e.get('network_j_per_byte', 0):.3g} J/byte{where}"))
    for k, v in rows:
        t.add_row(k, v)
    return t


WIDE = 10_000
"""Console width without a terminal: wide enough that nothing is wrapped or cut."""


def print_summary(summary: dict[str, Any], out_dir: str, *, console: Console | None = None) -> None:
    """The summary table, then ``run directory: OUT``, on stderr. Without a terminal (a log
    file, a pipe) rich would assume 80 columns and wrap or cut long values and paths; there
    the width is unbounded, and the last line is never wrapped (a path must stay copyable)."""
    console = console or Console(stderr=True)
    table = summary_table(summary)
    if not console.is_terminal:
        console = Console(file=console.file, width=WIDE, no_color=True, highlight=False)
        # rich wraps a title to the table's width: give it a line of its own
        console.print(str(table.title), soft_wrap=True, markup=False, highlight=False)
        table.title = None
    console.print(table)
    console.print(f"run directory: {out_dir}", soft_wrap=True, markup=False, highlight=False)
