"""The one meter: bytes by traffic class, layer and peer, and time by phase, fed by hooks.

Subscribe it to the run's :class:`~commgnn.dist.events.Hooks`; exchange code never calls
it directly. At the end of each epoch :meth:`Meter.end_epoch` reduces the epoch's
counters over ranks (sum and max) and resets them; :meth:`Meter.totals` gives the whole
run by class, layer and (sender, receiver) pair.

The meter's own reductions are measurement overhead and are not counted as traffic.
Time: ``comm`` is wall time inside collectives, ``wait`` is time in the barrier before
gradient sync (waiting for the slowest rank); ``compute`` is the rest of the epoch.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

import torch

from commgnn.dist.context import DistContext
from commgnn.dist.events import CommEvent, Event, TimeEvent

CLASSES = ("halo_fwd", "halo_bwd", "halo_eval", "grad_sync", "control")
PHASES = ("comm", "wait")


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass(frozen=True)
class EpochTraffic:
    """One epoch's bytes and times, summed over ranks and as the max over ranks."""

    bytes_sum: dict[str, int]
    bytes_max: dict[str, int]
    """Busiest rank's bytes sent, per class (the time floor is set by this, not the mean)."""
    comm_s_max: float
    wait_s_max: float
    epoch_s_max: float

    @property
    def halo_bytes(self) -> int:
        """Training halo traffic (forward rows and backward gradients), all ranks."""
        return self.bytes_sum["halo_fwd"] + self.bytes_sum["halo_bwd"]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sum.values())

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes_sum, "bytes_max_rank": self.bytes_max,
                "halo_bytes": self.halo_bytes, "grad_bytes": self.bytes_sum["grad_sync"],
                "total_bytes": self.total_bytes, "comm_s": self.comm_s_max,
                "wait_s": self.wait_s_max, "epoch_s": self.epoch_s_max,
                "compute_s": max(0.0, self.epoch_s_max - self.comm_s_max - self.wait_s_max)}


class Meter:
    """Counts what the hooks report on this rank; reduces over ranks on request."""

    def __init__(self, ctx: DistContext, num_layers: int) -> None:
        self.ctx, self.num_layers = ctx, num_layers
        P = ctx.world_size
        self._epoch = torch.zeros(len(CLASSES), dtype=torch.float64)
        self._time = dict.fromkeys(PHASES, 0.0)
        # cumulative: [class, receiver] bytes this rank sent, and [class, layer]
        self._by_peer = torch.zeros(len(CLASSES), P, dtype=torch.float64)
        self._by_layer = torch.zeros(len(CLASSES), num_layers + 1, dtype=torch.float64)

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, CommEvent):
            k = CLASSES.index(ev.kind)
            self._epoch[k] += ev.nbytes
            if ev.peer >= 0:
                self._by_peer[k, ev.peer] += ev.nbytes
            self._by_layer[k, ev.layer if ev.layer >= 0 else self.num_layers] += ev.nbytes
        elif isinstance(ev, TimeEvent):
            self._time[ev.phase] += ev.seconds

    def end_epoch(self, epoch_s: float) -> EpochTraffic:
        """Reduce this epoch's counters over ranks (all ranks call it), then reset them."""
        vec = torch.cat([self._epoch, torch.tensor([self._time["comm"], self._time["wait"], epoch_s],
                                                   dtype=torch.float64)])
        summed = self.ctx.all_reduce(vec.clone(), "sum")
        maxed = self.ctx.all_reduce(vec.clone(), "max")
        n = len(CLASSES)
        out = EpochTraffic(bytes_sum={c: int(summed[i]) for i, c in enumerate(CLASSES)},
                           bytes_max={c: int(maxed[i]) for i, c in enumerate(CLASSES)},
                           comm_s_max=float(maxed[n]), wait_s_max=float(maxed[n + 1]),
                           epoch_s_max=float(maxed[n + 2]))
        self._epoch.zero_()
        self._time = dict.fromkeys(PHASES, 0.0)
        return out

    def totals(self) -> dict[str, Any]:
        """Whole-run bytes by class x (sender, receiver) and by class x layer (all ranks call it)."""
        P = self.ctx.world_size
        pairs = torch.zeros(len(CLASSES), P, P, dtype=torch.float64)
        pairs[:, self.ctx.rank, :] = self._by_peer
        pairs = self.ctx.all_reduce(pairs)
        layers = self.ctx.all_reduce(self._by_layer.clone())
        rss = self.ctx.all_reduce(torch.tensor([peak_rss_mb()], dtype=torch.float64), "max")
        layer_names = [str(i) for i in range(self.num_layers)] + ["other"]
        return {
            "bytes_by_pair": {c: pairs[i].long().tolist() for i, c in enumerate(CLASSES)},
            "bytes_by_layer": {c: dict(zip(layer_names, layers[i].long().tolist()))
                               for i, c in enumerate(CLASSES)},
            "peak_rss_mb": float(rss[0]),
        }
