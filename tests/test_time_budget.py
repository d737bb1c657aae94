"""Adaptive bit-widths under a time budget: the controller meets it within 5%."""

from __future__ import annotations

import time

import pytest
import torch

from commgnn.comm.config import HaloConfig
from commgnn.comm.halo.adaptive import AdaptiveQuantized
from commgnn.comm.halo.exchange import RowExchange
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError


class SlowLink(RowExchange):
    """A network of ``rate`` bytes/s: moving n bytes takes latency + n / rate seconds
    (timed by a clock the test controls, so the test is exact and fast)."""

    def __init__(self, rate: float, latency: float, clock: list[float]) -> None:
        self.rate, self.latency, self.clock = rate, latency, clock
        self.plan, self.is_distributed = None, True  # type: ignore[assignment]
        self.epoch_s = 0.0

    def move(self, rows, out_counts, in_counts, layer, kind):
        self.clock[0] += self.latency + sum(out_counts) / self.rate
        self.epoch_s += self.latency + sum(out_counts) / self.rate
        return torch.zeros(sum(in_counts), dtype=rows.dtype)


@pytest.mark.parametrize("budget_s, rate", [(0.15, 6.7e5), (0.25, 6.7e5), (0.08, 1.7e6)])  # between all-1-bit and all-8-bit
def test_a_time_budget_is_met_within_5_percent(monkeypatch, budget_s, rate):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    link = SlowLink(rate, 1e-4, clock)
    ex = AdaptiveQuantized(link, ctx=DistContext.single(), hooks=Hooks(), num_layers=2, budget_bytes=None,
                           budget_s=budget_s, every=2, seed=0)
    g = torch.Generator().manual_seed(0)
    layers = [torch.randn(1000, 64, generator=g), torch.randn(1000, 32, generator=g) * 1e-3]
    spent = []
    for epoch in range(10):
        ex.set_epoch(epoch, exact=False)
        link.epoch_s = 0.0
        for layer, rows in enumerate(layers):
            ex.move(rows, [rows.shape[0]], [rows.shape[0]], layer, "halo_fwd")
            ex.move(rows, [rows.shape[0]], [rows.shape[0]], layer, "halo_bwd")
        spent.append(link.epoch_s)
    # 8 bits everywhere at first costs more than the budget; after the first solves it fits
    assert spent[0] > budget_s * 1.05
    for s in spent[4:]:
        assert s <= budget_s * 1.05, spent
        assert s >= budget_s * 0.5, spent  # and uses it: widths are not left at 1 bit for no reason
    assert ex.epoch_log()["bits_budget_bytes"] == pytest.approx(budget_s * link.rate, rel=0.05)


def test_one_budget_only():
    with pytest.raises(ConfigError, match="one budget"):
        HaloConfig(bits="adaptive", budget_mb=1.0, budget_s=0.1)
    with pytest.raises(ConfigError, match="one budget"):
        HaloConfig(bits="adaptive")
    with pytest.raises(ConfigError, match="only used with"):
        HaloConfig(bits=8, budget_s=0.1)
    assert HaloConfig(bits="adaptive", budget_s=0.1).budget_s == 0.1


# ---- staleness control: exact epochs when the measured staleness error is too large

class DriftingLink(RowExchange):
    """Returns, for every move, rows that drift by ``drift[epoch]`` (relative) per epoch."""

    def __init__(self, drift: list[float]) -> None:
        self.plan, self.is_distributed = None, True  # type: ignore[assignment]
        self.drift, self.epoch, self.calls = drift, 0, 0
        self.base = torch.ones(5, 4)

    def move(self, rows, out_counts, in_counts, layer, kind):
        self.calls += 1
        return self.base * (1 + sum(self.drift[: self.epoch + 1]))


def test_the_staleness_controller_orders_an_exact_epoch_when_stale_rows_drift_too_far():
    from commgnn.comm.halo.pipelined import Pipelined

    drift = [0.0, 0.01, 0.01, 0.5, 0.01, 0.01, 0.01]
    link = DriftingLink(drift)
    ex = Pipelined(link, smoothing=0.0, hooks=Hooks(), max_error=0.1)
    logs = []
    for epoch in range(len(drift)):
        link.epoch = epoch
        ex.set_epoch(epoch, exact=epoch == 0)
        calls = link.calls
        ex.move(torch.zeros(5, 4), [5], [5], 0, "halo_fwd")
        synchronous = ex.pending == {} and link.calls == calls + 1
        ex.flush()
        logs.append((ex.epoch_log(), synchronous))
    # epoch 3's rows jumped 50%: its stale rows were ~33% off, so epoch 4 is exact (and logged)
    assert logs[3][0]["stale_error"] > 0.1 and not logs[3][0]["exact_by_controller"]
    assert logs[4][0]["exact_by_controller"] and logs[4][1]
    # small drifts stay stale
    assert not any(log["exact_by_controller"] for log, _ in logs[1:4] + logs[5:])
    assert logs[5][0]["stale_error"] < 0.1
    state = ex.state_dict()
    assert "exact_next" in state and state["error"] == pytest.approx(logs[-1][0]["stale_error"])
