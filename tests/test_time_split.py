"""Time accounting: blocked comm, overlap on other threads, idle, the busiest rank's split."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from commgnn.dist.context import DistContext
from commgnn.dist.events import Hooks
from commgnn.metrics import Meter
from commgnn.report.records import summarise, time_split


def test_time_on_other_threads_is_overlap_not_taken_from_compute():
    hooks, meter = Hooks(), Meter(DistContext.single(), 2)
    hooks.subscribe(meter)
    meter.end_setup()
    t0 = time.perf_counter()
    with hooks.timed("comm"):
        time.sleep(0.05)

    def background() -> None:
        with hooks.timed("comm"):
            time.sleep(0.12)
    th = threading.Thread(target=background)
    th.start()
    with hooks.timed("wait"):
        time.sleep(0.02)
    th.join()
    traffic = meter.end_epoch(time.perf_counter() - t0)
    t = traffic.time_busiest
    assert t["comm"] == pytest.approx(0.05, abs=0.02) and t["wait"] == pytest.approx(0.02, abs=0.02)
    assert t["overlap"] == pytest.approx(0.12, abs=0.03)
    # compute is the epoch less the training thread's own phases; the overlap is not taken off
    assert t["compute"] == pytest.approx(t["epoch"] - t["comm"] - t["wait"], abs=1e-9)
    assert t["compute"] > 0.05
    assert meter.end_epoch(0.01).time_busiest["overlap"] == 0.0  # reset each epoch


def _row(epoch: int, val: float, epoch_s: float, busiest: dict[str, float]) -> dict:
    zero = {"halo_fwd": 0, "halo_bwd": 0, "halo_eval": 0}
    return {"epoch": epoch, "val_acc": val, "test_acc": val, "loss": 1.0, "train_acc": val, "epoch_s": epoch_s,
            "halo_bytes": 0, "grad_bytes": 0, "total_bytes": 0, "bytes": zero, "bytes_max_rank": zero,
            "time_mean_s": {"comm": 0.0, "wait": 0.0, "epoch": epoch_s}, "time_busiest_s": busiest}


def test_the_split_is_the_busiest_ranks_and_time_to_best_sums_the_epochs_up_to_it():
    b1 = {"compute": 1.0, "sample": 0.5, "comm": 0.2, "fetch": 0.3, "wait": 0.1, "overlap": 0.4}
    b2 = {"compute": 3.0, "sample": 0.0, "comm": 0.4, "fetch": 0.1, "wait": 0.3, "overlap": 0.0}
    rows = [_row(1, 0.5, 2.0, b1), _row(2, 0.8, 4.0, b2), _row(3, 0.7, 8.0, b1)]
    split = time_split(rows)
    assert split == pytest.approx({"compute": (1.5 + 3.0 + 1.5) / 3, "comm": (0.5 + 0.5 + 0.5) / 3,
                                   "idle": (0.1 + 0.3 + 0.1) / 3, "overlap": 0.8 / 3})
    totals = {"setup_bytes": {}, "peak_rss_mb": 1.0, "peak_rss_mb_by_rank": [1.0], "bytes_by_pair": {},
              "bytes_by_layer": {}}
    s = summarise(dataset="d", model="m", parts=2, rows=rows, totals=totals, partition={})
    assert s["best_epoch"] == 2 and s["time_to_best_val_s"] == pytest.approx(6.0)
    assert s["time_split"] == pytest.approx(split)
