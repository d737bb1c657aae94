"""Pipelined halo exchange (after PipeGCN): epoch t computes with epoch t-1's halo rows and
gradients while epoch t's exchange runs in the background.

Each ``move`` hands the fresh rows to a one-thread executor and returns what arrived for
the same (layer, direction) one epoch earlier; :meth:`flush` (after the backward pass)
waits for the background exchanges and makes their results the next epoch's rows. The
background collectives run on their own process group, so they never interleave with
the main thread's collectives. Only the wait in ``flush`` counts as communication time:
the rest overlapped with compute. Optional EMA smoothing of the stale rows and gradients:
``cache = g cache + (1 - g) fresh``. The first epoch, and every guard epoch, is exact.

Staleness control (``max_error``): when the fresh rows arrive, their relative distance
from the stale ones the epoch computed with, ``||fresh - stale|| / ||fresh||`` (largest over
layers, directions and ranks: one all-reduce, so that every rank takes the same decision and
they keep entering the same exchanges), is the staleness error actually incurred; above
``max_error`` the next epoch runs exact. The error and the decision are in the epoch log.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from commgnn.comm.halo.exchange import RowExchange, Wrapper
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks


class Pipelined(Wrapper):
    def __init__(self, inner: RowExchange, *, smoothing: float, hooks: Hooks, max_error: float = 0.0,
                 ctx: DistContext | None = None) -> None:
        """``ctx``: the ranks the controller's decision is agreed over (None: this rank alone)."""
        super().__init__(inner)
        self.smoothing, self.hooks, self.max_error, self.ctx = smoothing, hooks, max_error, ctx
        self.stale_epoch = False  # this epoch computes with last epoch's rows (same on every rank)
        self.error = 0.0          # the last stale epoch's measured error
        self.exact_next = False   # the controller asks for an exact epoch
        self.controlled = False   # this epoch is exact because the controller asked
        self.cache: dict[tuple[int, str], Tensor] = {}
        self.pending: dict[tuple[int, str], Future] = {}
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commgnn-pipe")
        self.max_staleness = 0
        """Largest age (epochs) of rows or gradients used so far (1 by design)."""

    def move(self, rows: Tensor, out_counts: list[int], in_counts: list[int], layer: int,
             kind: str) -> Tensor:
        key = (layer, kind)
        if kind not in ("halo_fwd", "halo_bwd") or self.exact_now or key not in self.cache:
            # synchronous, but still on the pool's thread: one thread owns the pipeline's group
            with self.hooks.timed("comm"):  # the training thread is blocked for all of it
                fresh = self.pool.submit(self.inner.move, rows, list(out_counts), list(in_counts), layer,
                                         kind).result()
            if kind in ("halo_fwd", "halo_bwd"):
                self.cache[key] = fresh.detach().clone()
            return fresh
        if key in self.pending:
            raise RuntimeError(f"pipelined exchange {key} started twice in one epoch without flush()")
        self.pending[key] = self.pool.submit(self.inner.move, rows.detach().clone(), list(out_counts),
                                             list(in_counts), layer, kind)
        self.max_staleness = max(self.max_staleness, 1)
        return self.cache[key].clone()  # a fresh tensor: autograd must not attach to the cache

    def set_epoch(self, epoch: int, exact: bool) -> None:
        self.controlled = self.exact_next and not exact
        self.stale_epoch = not (exact or self.exact_next) and bool(self.cache)
        super().set_epoch(epoch, exact or self.exact_next)
        self.exact_next = False

    def flush(self) -> None:
        errors = []
        with self.hooks.timed("comm"):  # only the part that did not overlap
            for key, fut in self.pending.items():
                fresh = fut.result().detach()
                if self.max_error:
                    norm = float(fresh.float().norm())
                    errors.append(float((fresh.float() - self.cache[key].float()).norm()) / max(norm, 1e-30))
                g = self.smoothing
                self.cache[key] = fresh if g == 0 else g * self.cache[key] + (1 - g) * fresh
        self.pending.clear()
        if self.max_error and self.stale_epoch:
            local = torch.tensor([max(errors, default=0.0)], dtype=torch.float64)
            if self.ctx is not None:
                with self.hooks.timed("comm"):
                    self.ctx.all_reduce(local, "max")
            self.error = float(local[0])
            self.exact_next = self.error > self.max_error
        super().flush()

    def epoch_log(self) -> dict[str, Any]:
        # stale_epoch: this epoch computed with last epoch's rows while its own exchange ran
        # behind compute (the cost model prices such epochs with the overlap)
        log = {**super().epoch_log(), "stale_epoch": self.stale_epoch}
        if not self.max_error:
            return log
        return {**log, "stale_error": self.error, "exact_by_controller": self.controlled}

    def own_state(self) -> dict[str, Any]:
        if self.pending:
            raise RuntimeError("state_dict() of a pipelined exchange while exchanges are in flight; call flush()")
        return {"cache": {f"{layer}:{kind}": t.detach().clone() for (layer, kind), t in self.cache.items()},
                "max_staleness": self.max_staleness, "error": self.error, "exact_next": self.exact_next}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.cache = {(int(k.split(":")[0]), k.split(":")[1]): t.clone() for k, t in state["cache"].items()}
        self.max_staleness = state["max_staleness"]
        self.error = state.get("error", 0.0)
        self.exact_next = state.get("exact_next", False)
