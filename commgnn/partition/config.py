"""Configuration of the partitioning step (the ``[partition]`` table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from commgnn.errors import ConfigError
from commgnn.partition.base import PARTITIONERS

# Importing the strategies fills PARTITIONERS, so `method` can be checked against it
# whichever module the caller imported first.
from commgnn.partition import contiguous as _contiguous  # noqa: F401  (registers "contiguous")
from commgnn.partition import metis as _metis  # noqa: F401  (registers "metis")
from commgnn.partition import random as _random  # noqa: F401  (registers "random")

Objective = Literal["cut", "vol"]


@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    """How to split the graph into one partition per rank."""

    method: str = "metis"
    """Strategy name in :data:`~commgnn.partition.base.PARTITIONERS`: ``metis``,
    ``random`` (balanced random) or ``contiguous`` (node id ranges)."""
    objective: Objective = "cut"
    """METIS objective: ``cut`` minimises cut edges, ``vol`` the total communication
    volume C = sum of halo sizes (what the exchange actually moves). Ignored by the others."""
    seed: int = 0
    """Seed of METIS and of the random strategy; the same seed gives the same partition."""
    hosts: int = 1
    """Place the partitions on this many hosts of ``P / hosts`` consecutive ranks so that
    the pairs exchanging the most halo rows share a host (``partition.placement``); 1 =
    ranks in the partitioner's order. ``commgnn cluster`` sets it to its ``--hosts``."""
    dir: str | None = None
    """A saved partition directory (``commgnn partition`` output) to load instead of
    partitioning; ``None`` partitions in memory."""

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
        if self.dir is not None and (not isinstance(self.dir, str) or not self.dir.strip()):
            raise ConfigError(f"dir must be a non-empty path or unset, got {self.dir!r}")
