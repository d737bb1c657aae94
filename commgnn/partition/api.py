"""Entry point of the partitioning step: validate, dispatch to a strategy, check the result."""

from __future__ import annotations

from torch import Tensor

from commgnn.errors import PartitionError
from commgnn.partition.base import PARTITIONERS, check_edge_index, check_parts
from commgnn.partition.config import PartitionConfig


def partition_graph(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
    """Assign every node to one of ``num_parts`` non-empty parts with ``cfg.method``.

    Returns ``[num_nodes]`` int64 part ids on the CPU. ``cfg.dir`` is not consulted here:
    loading a saved partition instead is the caller's choice (see
    :func:`commgnn.partition.store.load_partition`).
    """
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts <= 0:
        raise PartitionError(f"num_parts must be a positive int, got {num_parts!r}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise PartitionError(f"num_nodes must be an int >= 0, got {num_nodes!r}")
    if num_parts > num_nodes:
        raise PartitionError(f"cannot split {num_nodes} nodes into {num_parts} partitions")
    edge_index = check_edge_index(edge_index, num_nodes)
    parts = PARTITIONERS.get(cfg.method)(edge_index, num_nodes, num_parts, cfg)
    # Strategies are trusted but checked: a bad assignment would surface much later as a hang.
    return check_parts(parts, num_nodes, num_parts)
