"""Run records: the files a run leaves in its output directory.

``--out DIR`` holds

* ``config.toml``: the fully resolved run configuration (reloadable with ``--config``);
* ``manifest.json``: package and library versions, git commit, host, seed, dataset
  fingerprint and the partition report;
* ``partitions/``: the partition directory the ranks loaded (format in
  :mod:`commgnn.partition.store`), unless the run was given one;
* ``metrics.jsonl``: one JSON object per epoch (loss, accuracies, bytes by class summed
  over ranks and for the busiest rank, times);
* ``summary.json``: the run's outcome (keys listed in :func:`summarise`), written only
  when every rank finished;
* ``status.json``: whether the run finished: ``{"state": "running" | "complete" | "failed" |
  "interrupted", ...}`` with the one-line error of a failed run (:func:`write_status`);
* ``model.pt``, ``predictions.pt`` (and ``embeddings.pt`` when asked): the trained weights
  and scores, tensors only;
* ``hashes.json``: the SHA-256 of each of those, written after them; readers check it
  before loading (:mod:`commgnn.integrity`);
* ``logs/rank{r}.log``: each rank's standard error, with the traceback of a failure;
* ``checkpoints/``: the newest complete checkpoint, with ``runtime.checkpoint_every``.

The directory is first written as a hidden sibling and renamed into place, so a run that
fails on bad input leaves nothing half-written behind.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from commgnn.errors import DamagedRecord, UserError


def library_versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("commgnn", "torch", "torch_geometric", "numpy", "pymetis", "rich"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def git_commit() -> str | None:
    """Commit of the checkout commgnn runs from, if it is one (None otherwise)."""
    here = Path(__file__).resolve().parent
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5, check=False)
        if res.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() + ("+dirty" if dirty else "")


def host_info() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "machine": platform.machine(), "cores": cores}


def prepare_out_dir(out: Path) -> Path:
    """Check ``out`` may be written; return the hidden staging sibling to fill first."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"output directory {out} already exists and is not empty; choose another --out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output directory {out.parent}: {exc.strerror}") from None
    staging = out.parent / f".{out.name}.staging-{os.getpid()}"
    try:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
    except OSError as exc:
        raise UserError(f"cannot write in {out.parent}: {exc.strerror}") from None
    return staging


def commit_out_dir(staging: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # empty (checked by prepare_out_dir)
    staging.rename(out)
    (out / "logs").mkdir()
    write_status(out, "running")


STATUS = "status.json"


def write_status(out: Path, state: str, **extra: Any) -> None:
    """Record the run's state in ``status.json`` (best effort: a full or vanished disk must
    not hide the error that is being reported)."""
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    path = Path(out) / STATUS
    # Padded to a fixed size, so that on a full disk the record can still be overwritten in
    # place (no new blocks needed) when the atomic write-and-rename cannot get space.
    text = json.dumps({"state": state, "updated": now, "pid": os.getpid(), **extra}, indent=2)
    text = text.ljust(max(_STATUS_SIZE, len(text) + 1) - 1) + "\n"
    try:
        _write_atomic(path, text)
    except OSError:
        try:
            with open(path, "r+") as fh:
                if len(text) <= os.fstat(fh.fileno()).st_size:
                    fh.write(text.ljust(os.fstat(fh.fileno()).st_size - 1) + "\n")
        except OSError:
            pass


_STATUS_SIZE = 1024


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def standard_json(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (a Python float, or a NumPy float64) replaced by ``None``:
    standard JSON has no such numbers (``json.dumps`` would write bare ``NaN``). A tensor or
    NumPy array (anything with ``tolist``) becomes its list (or number) first."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: standard_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [standard_json(v) for v in obj]
    if hasattr(obj, "tolist"):  # a tensor, a NumPy array or scalar
        return standard_json(obj.tolist())
    return obj


def dumps_standard(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`standard_json` of ``obj``: never a bare ``NaN`` or ``Infinity``."""
    return json.dumps(standard_json(obj), allow_nan=False, **kwargs)


def write_json(path: Path, obj: Any) -> None:
    _write_atomic(path, dumps_standard(obj, indent=2, sort_keys=False) + "\n")


class MetricsLog:
    """Appends one JSON line per epoch (flushed, so a live run can be followed); standard
    JSON only: a non-finite value (a diverged loss) is written as ``null``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a")

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(dumps_standard(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass  # every line was flushed by write(), which raised already if it failed


def summarise(*, dataset: str, model: str, parts: int, rows: Iterable[dict[str, Any]],
              totals: dict[str, Any], partition: dict[str, Any]) -> dict[str, Any]:
    """Build ``summary.json`` from the per-epoch rows of ``metrics.jsonl``.

    Keys: ``dataset, model, parts, epochs_run, best_epoch, best_val_acc, test_acc`` (at the
    best validation epoch), ``halo_bytes_per_epoch`` and ``grad_bytes_per_epoch`` (means over
    epochs, summed over ranks), ``halo_bytes_per_epoch_max_rank``, ``total_bytes`` (all
    classes, all epochs, all ranks), ``epoch_time_s`` (median of the slowest rank's epoch),
    ``comm_time_frac``, ``wait_time_frac`` (of the mean rank's epoch time), ``time_split``
    (:func:`time_split`), ``setup_s`` (the trainer's set-up before the first epoch, slowest
    rank), ``time_to_best_val_s`` (``setup_s`` plus the slowest rank's epoch seconds summed
    up to the best validation epoch: a lever that front-loads work, such as a precomputed
    aggregation or a filled cache, pays for it here), ``peak_rss_mb`` (max over ranks),
    ``peak_rss_mb_sum`` (summed over ranks) and
    ``peak_rss_mb_by_rank``, ``peak_device_mb_by_rank`` (CUDA runs: each rank's
    ``torch.cuda.max_memory_allocated``; ``None`` on the CPU), ``time_by_rank_s`` (every
    rank's seconds per phase summed over the epochs: who computed, who waited), ``partition``
    (edge_cut, comm_volume, max_rank_halo), the byte breakdowns by pair and layer, and in
    mini-batch training the keys of :func:`minibatch_summary`.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("no epochs to summarise")
    best = max(rows, key=lambda r: (r["val_acc"], -r["epoch"]))
    n = len(rows)
    epoch_s = [r["epoch_s"] for r in rows]
    halo_max = [r["bytes_max_rank"]["halo_fwd"] + r["bytes_max_rank"]["halo_bwd"] for r in rows]
    return {
        "dataset": dataset,
        "model": model,
        "parts": parts,
        "epochs_run": n,
        "best_epoch": best["epoch"],
        "best_val_acc": best["val_acc"],
        "test_acc": best["test_acc"],
        "halo_bytes_per_epoch": sum(r["halo_bytes"] for r in rows) / n,
        "halo_bytes_per_epoch_max_rank": sum(halo_max) / n,
        "grad_bytes_per_epoch": sum(r["grad_bytes"] for r in rows) / n,
        "eval_halo_bytes_per_epoch": sum(r["bytes"]["halo_eval"] for r in rows) / n,
        "total_bytes": sum(r["total_bytes"] for r in rows),
        "epoch_time_s": statistics.median(epoch_s),
        # fractions of the mean rank's time
        "comm_time_frac": _frac(rows, "comm"),
        "wait_time_frac": _frac(rows, "wait"),
        "time_split": time_split(rows),
        "setup_s": totals.get("setup_s", 0.0),
        "time_to_best_val_s": totals.get("setup_s", 0.0) + sum(r["epoch_s"] for r in rows if r["epoch"] <= best["epoch"]),
        "setup_bytes": totals["setup_bytes"],
        "peak_rss_mb": totals["peak_rss_mb"],
        "peak_rss_mb_sum": sum(totals["peak_rss_mb_by_rank"]),
        "peak_rss_mb_by_rank": totals["peak_rss_mb_by_rank"],
        # CUDA runs only (None on the CPU): the allocator's peak per rank
        "peak_device_mb_by_rank": totals.get("peak_device_mb_by_rank"),
        "time_by_rank_s": totals.get("time_by_rank_s"),
        "partition": {k: partition.get(k) for k in ("edge_cut", "comm_volume", "max_rank_halo")},
        **minibatch_summary(rows),
        "bytes_by_pair": totals["bytes_by_pair"],
        "bytes_by_layer": totals["bytes_by_layer"],
        "byte_counting": ("payload handed to collectives; all-reduce = ring algorithm's 2(P-1)/P x bytes per "
                          "rank, all-gather = (P-1) x payload; in bytes_by_pair each rank r's collective "
                          "bytes are attributed to the ring pair (r, (r+1) % P)"),
    }


def time_split(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per epoch of the busiest rank (most compute in that epoch), mean over epochs:
    ``compute`` (with sampling), ``comm`` (blocked in collectives, with the feature fetch),
    ``idle`` (waiting for the slowest rank before gradient sync) and ``overlap``
    (communication on other threads, beside compute; not part of the epoch's sum)."""
    n = len(rows)
    busy = [r.get("time_busiest_s") or {k[:-2]: r[k] for k in r if k.endswith("_s") and k[:-2] in
                                        ("comm", "wait", "sample", "fetch", "compute")} for r in rows]
    def mean(*keys: str) -> float:
        return sum(b.get(k, 0.0) for b in busy for k in keys) / n
    return {"compute": mean("compute", "sample"), "comm": mean("comm", "fetch"), "idle": mean("wait"),
            "overlap": mean("overlap")}


def minibatch_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mini-batch keys of ``summary.json`` (empty for full-graph rows): ``steps_per_epoch``,
    ``feature_bytes_per_epoch`` (ids and rows fetched, all ranks, mean over epochs),
    ``cache_hit_rate``, ``cache_hit_rate_optimal`` (the best static set of the cache's size)
    and ``cache_hit_rate_belady`` (Belady's eviction from an empty cache each epoch: the
    bound for an LRU's first epoch, which later epochs begin warm; None where an epoch's
    trace was too long to replay), all over every epoch's remote
    requests and None without a cache; ``sample_time_frac`` and ``fetch_time_frac``."""
    if not rows or "steps" not in rows[0]:
        return {}
    n = len(rows)
    requests = sum(r["remote_requests"] for r in rows)
    out: dict[str, Any] = {
        "steps_per_epoch": rows[-1]["steps"],
        "feature_bytes_per_epoch": sum(r["bytes"]["fetch_ids"] + r["bytes"]["fetch_rows"] for r in rows) / n,
        "cache_hit_rate": None, "cache_hit_rate_optimal": None, "cache_hit_rate_belady": None,
        "sampled_nodes_per_step": sum(r["sampled_nodes_per_step"] for r in rows) / n,
        "sampled_edges_per_step": sum(r["sampled_edges_per_step"] for r in rows) / n,
        "sample_time_frac": _frac(rows, "sample"), "fetch_time_frac": _frac(rows, "fetch"),
    }
    if "cache_hit_rate" in rows[0] and requests:
        out["cache_hit_rate"] = sum(r["cache_hits"] for r in rows) / requests
        out["cache_hit_rate_optimal"] = sum(r["cache_hit_rate_optimal"] * r["remote_requests"] for r in rows) / requests
        belady = sum(r.get("cache_hit_rate_belady", math.nan) * r["remote_requests"] for r in rows) / requests
        out["cache_hit_rate_belady"] = None if math.isnan(belady) else belady
    return out


def _frac(rows: list[dict[str, Any]], phase: str) -> float:
    total = sum(r["time_mean_s"]["epoch"] for r in rows)
    return sum(r["time_mean_s"][phase] for r in rows) / max(total, 1e-12)


def read_json(path: Path) -> Any:
    """The JSON document at ``path``. A missing file raises :class:`FileNotFoundError` (for
    callers that treat it as absent); a file that cannot be read or is not JSON (cut short,
    altered) raises :class:`~commgnn.errors.DamagedRecord`, one line naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DamagedRecord(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise DamagedRecord(f"{path} is damaged (not JSON); it is not used") from None


def json_field(path: Path, *keys: str, kind: type | tuple[type, ...] = object) -> Any:
    """``read_json(path)[keys[0]][keys[1]]...``, or one line naming the file and the entry
    (:class:`~commgnn.errors.DamagedRecord`) when the file is missing or damaged, or does not
    hold that entry as an instance of ``kind``."""
    path = Path(path)
    try:
        value = read_json(path)
    except FileNotFoundError:
        raise DamagedRecord(f"{path} is missing") from None
    for i, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            raise DamagedRecord(f"{path} is damaged: it has no {'.'.join(keys[:i + 1])} entry")
        value = value[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        raise DamagedRecord(f"{path} is damaged: its {'.'.join(keys)} entry is not what a run records")
    return value
