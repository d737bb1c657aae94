"""Entry point of the partitioning step: validate, dispatch to a strategy, check the result."""

from __future__ import annotations

from torch import Tensor

from commgnn.distributed.memory import available_bytes
from commgnn.errors import PartitionError
from commgnn.partition.base import PARTITIONERS, check_edge_index, check_parts
from commgnn.partition.config import PartitionConfig


def assign_parts(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
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
    check_partition_memory(cfg, num_nodes, int(edge_index.shape[1]))
    parts = PARTITIONERS.get(cfg.method)(edge_index, num_nodes, num_parts, cfg)
    # Strategies are trusted but checked: a bad assignment would surface much later as a hang.
    return check_parts(parts, num_nodes, num_parts)


BYTES_PER_EDGE = {"metis": 120, "ldg": 60, "lp-metis": 32, "random": 0, "contiguous": 0}
"""Peak memory a partitioner adds per directed input edge, beyond the graph itself, rounded
up from a measurement on the synthetic CSBM (300k nodes, 6M edges, 4 parts; VmHWM over the
RSS before the call): METIS 110 B/edge (its symmetrised, deduplicated input plus its own
structures), LDG 55 B/edge (its int32 adjacency)."""
BYTES_PER_NODE = 64
"""Per-node arrays (parts, degrees, CSR offsets), any partitioner."""


def partition_memory_gb(method: str, num_nodes: int, num_edges: int) -> float:
    """Estimated peak memory (GB) that partitioning adds to the loaded graph."""
    return (BYTES_PER_EDGE.get(method, BYTES_PER_EDGE["metis"]) * num_edges + BYTES_PER_NODE * num_nodes) / 2**30


def _size(gb: float) -> str:
    return f"{gb:.1f} GB" if gb >= 1 else f"{gb * 1024:.0f} MB"


def check_partition_memory(cfg: PartitionConfig, num_nodes: int, num_edges: int) -> None:
    """Refuse, before allocating, a partitioning whose estimate exceeds ``cfg.memory_limit_gb``
    (0: the memory available now), naming the leaner strategy that would fit: an
    out-of-memory kill would leave nothing to read."""
    cap = cfg.memory_limit_gb or available_bytes() / 2**30
    need = partition_memory_gb(cfg.method, num_nodes, num_edges)
    if need <= cap:
        return
    lean = [m for m in ("ldg", "random") if partition_memory_gb(m, num_nodes, num_edges) <= cap]
    hint = (f"use --partitioner {lean[0]} (about {_size(partition_memory_gb(lean[0], num_nodes, num_edges))})"
            if lean else "partition on a machine with more memory and pass --partition-dir")
    raise PartitionError(f"partitioning {num_edges:,} edges with {cfg.method} needs about {_size(need)}, over "
                         f"the {_size(cap)} cap (partition.memory_limit_gb); {hint}")
