"""The one meter: bytes by traffic class, layer and peer, and time by phase, fed by hooks.

Subscribe it to the run's :class:`~commgnn.distributed.events.Hooks`; exchange code never calls
it directly. At the end of each epoch :meth:`Meter.end_epoch` gathers the epoch's
counters from all ranks (one small ``all_gather``) and resets them; :meth:`Meter.totals`
gives the whole run by class, layer and (sender, receiver) pair.

What is counted: every payload handed to a collective by halo exchanges, gradient sync and
the loss/accuracy reductions ("control"). All-reduce payloads are the ring algorithm's
``2 (P-1)/P x bytes`` per rank (backends do not expose wire bytes); all-gathers are counted
as a ring all-gather's ``(P-1) x payload``. Not counted: barriers (no payload) and the
meter's own gather, which is measurement overhead.

Pairs: point-to-point traffic (halo rows, gossip) goes to the (sender, receiver) pair it
names. A collective over all ranks (reported with peer = -1: all-reduces, all-gathers) is
attributed the way its bytes are counted: in a ring each rank r sends everything it sends
to rank ``(r + 1) % P``, so rank r's collective bytes go to pair ``(r, (r + 1) % P)``. So
every class's ``bytes_by_pair`` sums to its total, and a row sums to what that rank sent;
the ring pairs are the counting model's, not necessarily the links the backend used.

Time: ``comm`` is wall time the training thread spends blocked in collectives, ``wait`` is
time in the barrier before gradient sync (idle, waiting for the slowest rank), ``sample``
and ``fetch`` the mini-batch sampler's and the feature fetch's time on the training thread
(0 in full-graph training); ``compute`` is the rest of the epoch, per rank. ``overlap`` is
time other threads (a pipelined halo exchange, a prefetch) spent in any of those phases:
communication that ran beside compute, so it is not taken out of the epoch.
"""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any, get_args

import torch

from commgnn.distributed.context import DistContext
from commgnn.distributed.events import CommEvent, Event, TimeEvent, TrafficClass

CLASSES: tuple[str, ...] = get_args(TrafficClass)
PHASES = ("comm", "wait", "sample", "fetch")
TIMES = (*PHASES, "compute", "epoch", "overlap")


def peak_device_mb(device: torch.device) -> float:
    """Peak memory torch's caching allocator handed out on ``device`` in MiB
    (``torch.cuda.max_memory_allocated``: tensors, not the allocator's reserve or the CUDA
    context); 0 off CUDA."""
    if device.type != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated(device) / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process's own memory image in MiB.

    Linux's ``VmHWM`` (``/proc/self/status``) is the high-water mark of the current address
    space. ``getrusage``'s ``ru_maxrss`` is not: it survives ``execve``, so a rank spawned by
    a launcher that had already loaded and partitioned the graph would report the launcher's
    peak as its own. ``ru_maxrss`` remains the fallback where ``/proc`` is not available."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass(frozen=True)
class EpochTraffic:
    """One epoch's bytes and times over all ranks."""

    bytes_sum: dict[str, int]
    """Bytes sent per traffic class, summed over ranks."""
    bytes_max: dict[str, int]
    """Busiest rank's bytes sent per class (the time floor is set by this, not the mean)."""
    time_max: dict[str, float]
    """Slowest rank's seconds per phase (``comm``, ``wait``, ``compute``, ``epoch``)."""
    time_mean: dict[str, float]
    """Mean over ranks of the seconds per phase."""
    time_busiest: dict[str, float]
    """The seconds per phase of the rank with the most compute this epoch."""
    time_by_rank: dict[str, list[float]] = field(default_factory=dict)
    """Every rank's seconds per phase (``compute``, ``comm``, ``wait``, ...), in rank order:
    on heterogeneous hosts the fast ranks' ``wait`` is the time they block on a late one."""

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
                "total_bytes": self.total_bytes,
                **{f"{k}_s": v for k, v in self.time_max.items()},
                "time_mean_s": self.time_mean, "time_busiest_s": self.time_busiest,
                "time_by_rank_s": self.time_by_rank}


class Meter:
    """Counts what the hooks report on this rank; gathers over ranks on request."""

    def __init__(self, ctx: DistContext, num_layers: int) -> None:
        self.ctx, self.num_layers = ctx, num_layers
        P = ctx.world_size
        self._epoch = torch.zeros(len(CLASSES), dtype=torch.float64)
        self._time = dict.fromkeys(PHASES, 0.0)
        self._overlap = 0.0
        self._owner = threading.get_ident()  # the training thread; others overlap it
        # cumulative: [class, receiver] bytes this rank sent, and [class, layer (+ other)]
        self._by_peer = torch.zeros(len(CLASSES), P, dtype=torch.float64)
        self._by_layer = torch.zeros(len(CLASSES), num_layers + 1, dtype=torch.float64)
        self._lock = threading.Lock()
        self.setup: dict[str, int] = {}
        """Bytes per class sent before the first epoch (e.g. a precomputed aggregation)."""
        self.setup_s = 0.0
        """Seconds from this meter's creation to :meth:`end_setup` on the slowest rank (the
        trainer's set-up: a precomputed aggregation, a cache filled, a sampler built)."""
        self._born = time.perf_counter()
        self._run_times = torch.zeros(ctx.world_size, len(TIMES), dtype=torch.float64)
        """``[P, times]`` every rank's seconds per phase, summed over the epochs."""

    def end_setup(self) -> None:
        """Move what was counted so far (set-up traffic) out of the first epoch, and take
        the set-up time (slowest rank; it rides on the same gather)."""
        elapsed = torch.tensor([time.perf_counter() - self._born], dtype=torch.float64)
        rows = self.ctx.all_gather(torch.cat([self._epoch, elapsed]))
        self.setup = {c: int(v) for c, v in zip(CLASSES, rows[:, :len(CLASSES)].sum(0))}
        self.setup_s = float(rows[:, len(CLASSES)].max())
        self._epoch.zero_()
        self._time = dict.fromkeys(PHASES, 0.0)
        self._overlap = 0.0

    def __call__(self, ev: Event) -> None:
        with self._lock:  # pipelined exchanges report from a background thread
            self._record(ev)

    def _record(self, ev: Event) -> None:
        if isinstance(ev, CommEvent):
            k = CLASSES.index(ev.kind)
            self._epoch[k] += ev.nbytes
            # a collective (peer -1) is counted as a ring: it all goes to the next rank
            peer = ev.peer if ev.peer >= 0 else (self.ctx.rank + 1) % self.ctx.world_size
            self._by_peer[k, peer] += ev.nbytes
            self._by_layer[k, ev.layer if ev.layer >= 0 else self.num_layers] += ev.nbytes
        elif isinstance(ev, TimeEvent):
            if threading.get_ident() == self._owner:
                self._time[ev.phase] += ev.seconds
            else:
                self._overlap += ev.seconds

    def end_epoch(self, epoch_s: float) -> EpochTraffic:
        """Gather this epoch's counters from all ranks (all ranks call it), then reset them."""
        phases = [self._time[k] for k in PHASES]
        times = [*phases, max(0.0, epoch_s - sum(phases)), epoch_s, self._overlap]
        rows = self.ctx.all_gather(torch.cat([self._epoch, torch.tensor(times, dtype=torch.float64)]))
        n = len(CLASSES)
        b_sum, b_max = rows[:, :n].sum(0), rows[:, :n].max(0).values
        t_max, t_mean = rows[:, n:].max(0).values, rows[:, n:].mean(0)
        busiest = rows[int(rows[:, n + TIMES.index("compute")].argmax()), n:]
        self._run_times += rows[:, n:]
        self._epoch.zero_()
        self._time = dict.fromkeys(PHASES, 0.0)
        self._overlap = 0.0
        return EpochTraffic(bytes_sum={c: int(b_sum[i]) for i, c in enumerate(CLASSES)},
                            bytes_max={c: int(b_max[i]) for i, c in enumerate(CLASSES)},
                            time_max={k: float(t_max[i]) for i, k in enumerate(TIMES)},
                            time_mean={k: float(t_mean[i]) for i, k in enumerate(TIMES)},
                            time_busiest={k: float(busiest[i]) for i, k in enumerate(TIMES)},
                            time_by_rank={k: [round(float(v), 6) for v in rows[:, n + i]] for i, k in enumerate(TIMES)})

    def totals(self) -> dict[str, Any]:
        """Whole-run bytes by class x (sender, receiver) and by class x layer, and peak
        memory per rank (all ranks call it). Collectives are in the ring pairs
        ``(r, (r + 1) % P)`` (see the module docstring)."""
        pairs = self.ctx.all_gather(self._by_peer).transpose(0, 1)  # [class, sender, receiver]
        layers = self.ctx.all_gather(self._by_layer).sum(0)
        rss = self.ctx.all_gather(torch.tensor([peak_rss_mb()], dtype=torch.float64))[:, 0]
        on_cuda = self.ctx.device.type == "cuda"  # every rank's device is of one type
        dev = self.ctx.all_gather(torch.tensor([peak_device_mb(self.ctx.device)], dtype=torch.float64))[:, 0] \
            if on_cuda else None
        layer_names = [str(i) for i in range(self.num_layers)] + ["other"]
        return {
            "bytes_by_pair": {c: pairs[i].long().tolist() for i, c in enumerate(CLASSES)},
            "bytes_by_layer": {c: dict(zip(layer_names, layers[i].long().tolist()))
                               for i, c in enumerate(CLASSES)},
            "setup_bytes": self.setup,
            "setup_s": self.setup_s,
            "peak_rss_mb": float(rss.max()),
            "peak_rss_mb_by_rank": rss.tolist(),
            "time_by_rank_s": {k: [round(float(v), 6) for v in self._run_times[:, i]] for i, k in enumerate(TIMES)},
            "peak_device_mb_by_rank": dev.tolist() if dev is not None else None,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"by_peer": self._by_peer.clone(), "by_layer": self._by_layer.clone(),
                "run_times": self._run_times.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._by_peer.copy_(state["by_peer"])
        self._by_layer.copy_(state["by_layer"])
        if "run_times" in state:  # checkpoints written before per-rank times were kept
            self._run_times.copy_(state["run_times"])
