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
from dataclasses import dataclass
from typing import Literal

from commgnn.config import positive
from commgnn.errors import ConfigError


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault throws."""


@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """One injected failure."""

    rank: int = 0
    """The rank that fails."""
    at: Literal["startup", "train", "eval"] = "train"
    """When: after set-up before the first epoch, at the start of an epoch's training step,
    or at the start of its evaluation."""
    epoch: int = 1
    """The epoch (1-based) of ``train`` and ``eval`` faults."""
    action: Literal["raise", "kill", "stop"] = "raise"
    """``raise`` an exception, ``kill`` the process with SIGKILL (a crash), or ``stop`` it
    with SIGSTOP (a hung rank)."""
    attempt: int = 0
    """Inject only in this torchrun attempt (0 = the first; restarts run clean)."""

    def __post_init__(self) -> None:
        positive("fault.rank", self.rank, allow_zero=True)
        positive("fault.epoch", self.epoch)
        positive("fault.attempt", self.attempt, allow_zero=True)
        if self.at not in ("startup", "train", "eval"):
            raise ConfigError(f"fault.at must be 'startup', 'train' or 'eval', got {self.at!r}")
        if self.action not in ("raise", "kill", "stop"):
            raise ConfigError(f"fault.action must be 'raise', 'kill' or 'stop', got {self.action!r}")


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
