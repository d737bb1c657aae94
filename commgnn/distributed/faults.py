"""Fault injection, for testing what commgnn promises on failure (``[fault]`` in a run's TOML).

A run with a ``[fault]`` table makes one rank fail on purpose at a chosen moment: the
tests and ``benchmarks/faults.py`` use it to check that the job ends fast, names that
rank, and leaves no process behind. Nobody else needs it; without the table nothing is
injected and the hook costs one comparison per phase.
"""

from __future__ import annotations

import os
import signal
import time

from commgnn.distributed.config import FaultConfig  # noqa: F401 (its home is config.py)


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault throws."""


class FaultInjector:
    """Calls ``(phase, epoch)`` from the training loop; fails when they match the config."""

    def __init__(self, cfg: FaultConfig, rank: int, attempt: int) -> None:
        self.cfg = cfg
        self.armed = cfg.rank == rank and cfg.attempt == attempt

    def __call__(self, phase: str, epoch: int) -> None:
        if not self.armed or phase != self.cfg.at or (phase != "startup" and epoch != self.cfg.epoch):
            return
        # The moment of the fault, for the fault benchmark (fd 2 is the rank's log).
        os.write(2, f"commgnn-fault: {self.cfg.action} at {phase} {epoch}, t={time.time():.3f}\n".encode())
        if self.cfg.action == "raise":
            raise InjectedFault(f"injected fault at {phase} of epoch {epoch}")
        os.kill(os.getpid(), signal.SIGKILL if self.cfg.action == "kill" else signal.SIGSTOP)
