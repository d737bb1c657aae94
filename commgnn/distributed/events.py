"""Communication and timing events, and the hook bus that carries them (a leaf module).

Exchange code stays free of bookkeeping: it only calls ``hooks.sent(...)`` with the
payload it actually handed to a collective, and wraps blocking calls in
``hooks.timed("comm")``. Whoever wants to count (the :class:`commgnn.metrics.Meter`)
subscribes to the bus. With no subscriber the calls cost a list iteration.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Union

TrafficClass = Literal["halo_fwd", "halo_bwd", "halo_eval", "halo_setup", "grad_sync", "control",
                       "fetch_ids", "fetch_rows", "fetch_setup", "topology"]
"""Traffic classes: halo rows forward (training), halo gradients backward, halo rows of
exact evaluation passes, one-time halo traffic before training (precomputation), gradient
/ model synchronisation, and control (small reductions of loss and accuracy counts, and
levers' own agreements such as bit-width tables). Mini-batch training adds the ids a rank
requests from their owners (``fetch_ids``, with the per-peer counts), the feature rows sent
back (``fetch_rows``), one-time fetches of set-up (``fetch_setup``: filling a static cache,
precomputed aggregates) and adjacency moved between ranks (``topology``: the replicated
CSR's gather at set-up, or sampled neighbour lists from their owners)."""

Phase = Literal["comm", "wait", "sample", "fetch"]
"""Timed phases: collectives of training (``comm``), the barrier before gradient sync
(``wait``), and in mini-batch training sampling (``sample``, including the collectives of
a partitioned topology) and feature fetches (``fetch``). Compute time is the epoch's wall
time minus these."""


@dataclass(frozen=True, slots=True)
class CommEvent:
    """``nbytes`` of payload this rank sent to ``peer`` (-1: a collective over all ranks)."""

    kind: TrafficClass
    layer: int
    peer: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class TimeEvent:
    """``seconds`` of wall time this rank spent in ``phase``."""

    phase: Phase
    seconds: float


Event = Union[CommEvent, TimeEvent]


class Hooks:
    """A list of subscribers that receive every :data:`Event`."""

    def __init__(self) -> None:
        self._subs: list[Callable[[Event], None]] = []
        self._timing = True

    def bytes_only(self) -> "Hooks":
        """A view that forwards byte events but drops timings: for work that runs in the
        background, overlapped with compute, whose waiting is timed where it happens."""
        view = Hooks()
        view._subs = self._subs
        view._timing = False
        return view

    def subscribe(self, fn: Callable[[Event], None]) -> None:
        self._subs.append(fn)

    def emit(self, event: Event) -> None:
        if not self._timing and isinstance(event, TimeEvent):
            return
        for fn in self._subs:
            fn(event)

    def sent(self, kind: TrafficClass, layer: int, peer: int, nbytes: int) -> None:
        if nbytes:
            self.emit(CommEvent(kind, layer, peer, int(nbytes)))

    @contextmanager
    def timed(self, phase: Phase) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.emit(TimeEvent(phase, time.perf_counter() - t0))
