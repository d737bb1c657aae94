"""Transient stragglers (``--straggle HOST:every=5s:for=1s``): a host's processes stopped
and continued on a schedule.

One thread a straggler: it lets the host run ``every - for`` seconds, then sends SIGSTOP to
the host's ranks and SIGCONT ``for`` seconds later, for as long as the job runs. The
host's torchrun agent keeps running: host 0's agent serves the store that every rank's
heartbeat and the rendezvous go through, so stopping it would stall every host, not one. A stopped rank makes every rank that exchanges with
it wait, which is what the emulation is for. :meth:`Stragglers.stop` continues whatever it
stopped, so no process is left stopped when the job ends, and :attr:`Stragglers.log`
keeps each pause (host, start and length, seconds from the start).

``for`` must stay below the job's heartbeat time-out: a rank stopped longer sends no
heartbeat and the others stop the job as if it had died. Written here: stopping a process
tree on a schedule is a few lines of ``os.kill``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Sequence


class Stragglers:
    """The schedule ``plan`` (``(host, every_s, for_s)`` each) over the processes
    ``pids(host)`` returns; started by :meth:`start`, ended by :meth:`stop`."""

    def __init__(self, plan: Sequence[tuple[int, float, float]], pids: Callable[[int], list[int]]) -> None:
        self.plan = list(plan)
        self.pids = pids
        self.log: list[tuple[int, float, float]] = []
        """``(host, start_s, length_s)`` of each pause, from :meth:`start`."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stopped: set[int] = set()
        self._threads = [threading.Thread(target=self._run, args=entry, daemon=True, name=f"straggle-{entry[0]}")
                         for entry in self.plan]
        self._t0 = 0.0

    def start(self) -> "Stragglers":
        self._t0 = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def _signal(self, pids: list[int], sig: int) -> list[int]:
        sent = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        return sent

    def _run(self, host: int, every: float, length: float) -> None:
        while not self._stop.wait(every - length):
            with self._lock:
                if self._stop.is_set():
                    return
                paused = self._signal(self.pids(host), signal.SIGSTOP)
                self._stopped.update(paused)
            start = time.monotonic()
            self._stop.wait(length)
            with self._lock:
                self._signal(paused, signal.SIGCONT)
                self._stopped.difference_update(paused)
            if paused:
                self.log.append((host, round(start - self._t0, 3), round(time.monotonic() - start, 3)))

    def stop(self) -> None:
        """End the schedule and continue every process still stopped."""
        self._stop.set()
        with self._lock:
            self._signal(sorted(self._stopped), signal.SIGCONT)
            self._stopped.clear()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=5.0)
