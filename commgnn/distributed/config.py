"""The runtime's configs: how ranks start and talk (``[runtime]``) and a failure injected on
purpose for testing (``[fault]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commgnn.config import positive
from commgnn.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """How ranks are started and talk to each other."""

    parts: int = 2
    """Number of ranks P (= partitions) started locally by ``commgnn train``. Under
    ``torchrun`` the world size comes from its environment and replaces this."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend; ``auto`` picks NCCL when every local rank has its own GPU, else gloo."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where tensors live; ``auto`` = CUDA when available for every local rank, else CPU.
    ``cuda`` with ``backend = "gloo"`` also runs more local ranks than GPUs: rank ``r`` uses
    GPU ``r mod #GPUs``, and gloo stages the device tensors of each collective through the
    host (NCCL refuses two ranks on one GPU). It is for running many ranks' compute on a few
    GPUs (tests, benchmarks of accuracy and bytes), not for speed: every message crosses PCIe."""
    timeout_s: float = 120.0
    """Collective time-out in seconds: a dead or stuck peer makes the others fail after at most this."""
    heartbeat_s: float = 0.0
    """A rank whose heartbeat stops for this long (after set-up) is named as failed and the
    job ends; 0 = ``min(30, max(2, timeout_s / 2))``. Heartbeats go through the rendezvous store,
    every 0.5 s, from a thread that keeps beating while the rank computes."""
    threads: int = 0
    """Intra-op threads per rank; 0 = the machine's cores divided by the local ranks (at least 1)."""
    memory_limit_gb: float = 0.0
    """Refuse a job whose estimated memory (all ranks and the launcher) exceeds this;
    0 = the machine's available memory at start."""
    force: bool = False
    """Start more local ranks than 8 per core (refused otherwise: they would only thrash)."""
    compute_alone: bool = True
    """After full-graph training, time each rank's forward and backward with the machine to
    itself, one rank at a time (``compute_alone_s`` in ``summary.json``): the ranks of one
    machine share its cores, a cluster's hosts do not."""
    gc_freeze: bool = False
    """Move the objects alive when training starts (modules, graph, model) out of Python's
    garbage collector's view for the epochs (``gc.freeze``; ``gc.unfreeze`` after). Why:
    ranks running the same code reach a full collection at the same epoch, and local ranks
    sharing few cores then all collect at once, which makes one epoch several times longer
    than the others. Off by default: it evens the epochs of short runs (probes, twins), but
    long runs were not faster with it (see the docs' results pages)."""
    split_wait: bool = False
    """Time each halo exchange's wait for the last rank to arrive apart from its transfer:
    one barrier before the exchange, its seconds counted as ``wait`` (``time_by_rank_s``),
    not ``comm``. For uneven hosts: without it, a rank blocked in an exchange for a late
    peer is counted as communicating. It costs one round trip an exchange."""
    checkpoint_every: int = 0
    """Write an atomic checkpoint of every rank's state every k epochs (0 = never); a
    resumed or elastically restarted run continues from the newest complete one."""
    master_addr: str = "127.0.0.1"
    """Rendezvous address for locally spawned ranks."""
    port: int = 0
    """Rendezvous port for locally spawned ranks; 0 picks a free one."""

    @property
    def heartbeat_timeout_s(self) -> float:
        """The heartbeat time-out in force (``heartbeat_s``, or its automatic value)."""
        return self.heartbeat_s or min(30.0, max(2.0, self.timeout_s / 2))

    def __post_init__(self) -> None:
        positive("runtime.parts", self.parts)
        positive("runtime.timeout_s", self.timeout_s)
        positive("runtime.heartbeat_s", self.heartbeat_s, allow_zero=True)
        # Upper bounds: torch.set_num_threads crashes on huge counts, and C ints hold the time-outs.
        for key, value, cap in (("threads", self.threads, 4096), ("timeout_s", self.timeout_s, 7 * 86400.0),
                                ("heartbeat_s", self.heartbeat_s, 7 * 86400.0)):
            if value > cap:
                raise ConfigError(f"runtime.{key} must be at most {cap:g}, got {value:g}")
        positive("runtime.memory_limit_gb", self.memory_limit_gb, allow_zero=True)
        positive("runtime.checkpoint_every", self.checkpoint_every, allow_zero=True)
        if self.heartbeat_s and self.heartbeat_s < 2:
            raise ConfigError(f"runtime.heartbeat_s must be 0 (automatic) or at least 2 s (beats come "
                              f"every 0.5 s), got {self.heartbeat_s}")
        positive("runtime.threads", self.threads, allow_zero=True)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"runtime.port must lie in [0, 65535], got {self.port}")


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
