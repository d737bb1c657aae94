"""An emulated multi-host cluster on one Linux machine: network namespaces, shaped links,
torchrun across them (``commgnn cluster``)."""

from commgnn.cluster.config import ClusterConfig
from commgnn.cluster.agents import run_cluster
from commgnn.cluster.netns import EmulatedNetwork, check_rights, remove_stale

__all__ = ["ClusterConfig", "EmulatedNetwork", "check_rights", "remove_stale", "run_cluster"]
