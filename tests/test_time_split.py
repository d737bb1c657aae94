"""Time accounting: blocked comm, overlap on other threads, idle, the busiest rank's split."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
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


def test_set_up_time_is_measured_to_the_end_of_set_up_and_not_in_the_first_epoch():
    meter = Meter(DistContext.single(), 2)
    time.sleep(0.08)  # the trainer's set-up
    meter.end_setup()
    time.sleep(0.03)
    assert 0.08 <= meter.setup_s < 0.5
    assert meter.totals()["setup_s"] == meter.setup_s


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
              "bytes_by_layer": {}, "setup_s": 0.25}
    s = summarise(dataset="d", model="m", parts=2, rows=rows, totals=totals, partition={})
    assert s["best_epoch"] == 2 and s["time_to_best_val_s"] == pytest.approx(0.25 + 6.0)  # set-up counts
    assert s["setup_s"] == 0.25
    assert s["time_split"] == pytest.approx(split)


# ---- compute alone: the replayed step does the same work as the real one

def alone_rank(ctx, data, parts):
    from commgnn.models import ModelConfig
    from commgnn.partition import build_local_partition
    from commgnn.trainers import FullGraphTrainer, TrainConfig
    from commgnn.trainers import solo

    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    t = FullGraphTrainer(ctx, part, ModelConfig(name="gcn", hidden=8, dropout=0.0), TrainConfig(epochs=1), Hooks())
    real = solo.AllToAllHalo(ctx, solo.halo_plan(t.part), Hooks())

    class ZeroedAfterExchange(solo.Wrapper):  # communicates, then hands back zeros of what came
        def move(self, rows, out_counts, in_counts, layer, kind):
            return torch.zeros_like(self.inner.move(rows, out_counts, in_counts, layer, kind))

    grads, moves = [], []
    for halo in (ZeroedAfterExchange(real), solo._Silent(real)):
        calls = []
        original = halo.move
        halo.move = lambda *a, _o=original, _c=calls: _c.append(a[3:]) or _o(*a)
        logits = t.model(t.x, t.graph, halo)
        loss = torch.nn.functional.cross_entropy(logits[t.part.train_mask], t.part.y[t.part.train_mask])
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in t.model.parameters()]))
        moves.append(calls)
        t.model.zero_grad(set_to_none=True)
    # one alone step = the training forward and backward plus the evaluation forward
    step_moves = []
    silent = solo._Silent(real)
    original = silent.move
    silent.move = lambda *a: step_moves.append(a[3:]) or original(*a)
    solo._step(t, silent)
    t.model.train()
    before = torch.get_rng_state()
    alone = solo.compute_alone(t, repeats=2)
    # the silent exchange's blocks have exactly the real blocks' shapes: the same step, bit for bit
    return {"same": bool(torch.equal(grads[0], grads[1])) and moves[0] == moves[1], "moves": len(moves[0]),
            "alone": alone, "step_moves": step_moves, "train_moves": moves[0],
            "mode_kept": t.model.training,
            "rng_kept": bool(torch.equal(before, torch.get_rng_state())),
            "grads_cleared": all(p.grad is None for p in t.model.parameters())}


@pytest.mark.timeout(120)
def test_compute_alone_replays_the_same_step_and_leaves_training_untouched(tmp_path):
    from helpers import run_on_ranks, small_graph
    from commgnn.partition import assign_parts
    from commgnn.partition.config import PartitionConfig

    data = small_graph(n=120, m=480)
    parts = assign_parts(data.edge_index, data.num_nodes, 2, PartitionConfig(method="random"))
    res = run_on_ranks(alone_rank, 2, tmp_path, data, parts, timeout_s=90)
    for r in res:
        assert r["same"] and r["moves"] >= 3  # 2 forward exchanges and at least one backward
        assert r["rng_kept"] and r["grads_cleared"] and r["mode_kept"]
        evals = [(layer, "halo_eval") for layer, kind in r["train_moves"] if kind == "halo_fwd"]
        assert r["step_moves"] == r["train_moves"] + evals  # then the evaluation forward's exchanges
        assert len(r["alone"]) == 2 and all(a > 0 for a in r["alone"]) and r["alone"] == res[0]["alone"]
