"""Configuration of the partitioning step (the ``[partition]`` table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from typing import TYPE_CHECKING, Any, Callable

from commgnn.errors import ConfigError
from commgnn.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

# This module imports nothing else of the package: the strategies name PartitionConfig in
# their signatures, so the registry they fill lives here, and they register themselves
# when the package is imported (commgnn/partition/__init__.py runs before this module,
# whichever one the caller names), so `method` is checked against all of them.
PARTITIONERS: Registry[Callable[["Tensor", int, int, Any], "Tensor"]] = Registry("partitioner")
"""Strategies by name (``metis``, ``random``, ``contiguous``, ``ldg``, ``lp-metis``)."""

ReorderMethod = Literal["none", "degree", "rcm", "metis"]
REORDER_METHODS: tuple[str, ...] = get_args(ReorderMethod)
"""Node orders inside a partition (:mod:`commgnn.partition.reorder`)."""

Objective = Literal["cut", "vol"]
FeatureStore = Literal["copy", "source"]


@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    """How to split the graph into one partition per rank."""

    method: str = "metis"
    """Strategy name in :data:`~commgnn.partition.base.PARTITIONERS`: ``metis``,
    ``random`` (balanced random), ``contiguous`` (node id ranges), ``ldg`` (streaming
    linear deterministic greedy: far less memory than METIS, a worse cut) or ``lp-metis``
    (label-propagation clusters, then METIS on the coarse graph: memory bounded by the
    nodes, the CSR on disk for a graph folder; a cut close to METIS's)."""
    objective: Objective = "cut"
    """METIS objective: ``cut`` minimises cut edges, ``vol`` the total communication
    volume C = sum of halo sizes (what the exchange actually moves). Ignored by the others."""
    seed: int = 0
    """Seed of METIS and of the random strategy; the same seed gives the same partition."""
    hosts: int = 1
    """Place the partitions on this many hosts of ``P / hosts`` consecutive ranks so that
    the pairs exchanging the most halo rows share a host (``partition.placement``); 1 =
    ranks in the partitioner's order. ``commgnn cluster`` sets it to its ``--hosts``."""
    memory_limit_gb: float = 0.0
    """Refuse to partition when the estimated peak exceeds this many GB (0 = the memory
    available when partitioning starts), with an error naming a strategy that fits
    (``ldg`` needs about half of METIS's memory per edge), instead of an out-of-memory kill."""
    dir: str | None = None
    """A saved partition directory (``commgnn partition`` output) to load instead of
    partitioning; ``None`` partitions in memory."""
    features: FeatureStore = "copy"
    """Where the rank folders of a graph folder's partition keep the feature rows:
    ``copy`` (each folder gets its owned rows, ``x.npy``) or ``source`` (no copy: a rank
    reads its rows from the graph's ``x.npy`` by id, memory-mapped; the file's sha256 is
    recorded at partitioning and its size, shape and dtype checked at every load). ``source``
    saves the features' size on disk (25.6 GB for a papers100M-shaped graph)."""
    reorder: ReorderMethod = "none"
    """Renumber each rank's owned nodes for memory locality of the aggregation's gathers,
    once, right after its partition is built or loaded (``partition.reorder``): ``degree``
    (descending in-degree), ``rcm`` (reverse Cuthill-McKee, narrowest band), ``metis``
    (METIS blocks of ~4096 nodes) or ``none``. Same model and results up to summation order
    (and dropout's per-row masks, which fall on other nodes); full-graph training only
    (mini-batch sampling needs ascending ids). Partition directories are not changed by it."""

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in PARTITIONERS:
            raise ConfigError(f"method: unknown partitioner {self.method!r} "
                              f"(choose from: {', '.join(PARTITIONERS.names())})")
        if self.objective not in get_args(Objective):
            raise ConfigError(f"objective: {self.objective!r} is not one of 'cut', 'vol'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {self.seed!r:.40}")
        if self.seed >= 2**63:  # METIS and torch.manual_seed take 64-bit seeds
            raise ConfigError(f"seed must be below 2**63, got {self.seed:.3e}")
        if isinstance(self.hosts, bool) or not isinstance(self.hosts, int) or self.hosts < 1:
            raise ConfigError(f"hosts must be an int >= 1, got {self.hosts!r:.40}")
        if isinstance(self.memory_limit_gb, bool) or not isinstance(self.memory_limit_gb, (int, float)) \
                or not 0 <= self.memory_limit_gb < float("inf"):
            raise ConfigError(f"memory_limit_gb must be a number >= 0 (0 = available memory), "
                              f"got {self.memory_limit_gb!r:.40}")
        if self.dir is not None and (not isinstance(self.dir, str) or not self.dir.strip()):
            raise ConfigError(f"dir must be a non-empty path or unset, got {self.dir!r}")
        if self.features not in get_args(FeatureStore):
            raise ConfigError(f"features: {self.features!r:.40} is not one of 'copy', 'source' (where rank "
                              f"folders keep the feature rows)")
        if not isinstance(self.reorder, str) or self.reorder not in REORDER_METHODS:
            raise ConfigError(f"reorder: {self.reorder!r:.40} is not one of "
                              f"{', '.join(repr(m) for m in REORDER_METHODS)} (node order inside a "
                              f"partition; 'none' keeps ascending global ids)")
