"""The partitioner registry and helpers shared by the strategies and the builders.

A partitioner is a function registered in :data:`PARTITIONERS` under a short name::

    fn(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor

returning ``[num_nodes]`` int64 part ids in ``[0, num_parts)`` with every part non-empty.
Callers go through :func:`commgnn.partition.api.partition_graph`, which validates the
arguments before and the assignment after, so strategies may assume sane input.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from commgnn.errors import PartitionError
from commgnn.partition.config import PARTITIONERS, PartitionConfig

Partitioner = Callable[[Tensor, int, int, PartitionConfig], Tensor]
"""Signature of a registered partitioning strategy."""

__all__ = ["PARTITIONERS", "Partitioner", "chunk_ids", "check_edge_index", "check_parts"]


def chunk_ids(num_items: int, num_chunks: int) -> Tensor:
    """``[num_items]`` int64 chunk ids, non-decreasing, chunk sizes differing by at most 1.

    The first ``num_items % num_chunks`` chunks get the extra item, so sizes are
    ``ceil`` then ``floor`` of the mean; a chunk is empty only if ``num_items < num_chunks``.
    """
    base, extra = divmod(num_items, num_chunks)
    sizes = torch.full((num_chunks,), base, dtype=torch.int64)
    sizes[:extra] += 1
    return torch.repeat_interleave(torch.arange(num_chunks, dtype=torch.int64), sizes)


def check_edge_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Return ``edge_index`` as a CPU int64 ``[2, E]`` tensor, or raise a :class:`PartitionError`."""
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index).__name__
        raise PartitionError(f"edge_index must be a [2, E] tensor, got {shape}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise PartitionError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    edge_index = edge_index.to("cpu", torch.int64)
    if edge_index.numel() > 0:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise PartitionError(f"edge_index refers to node {lo if lo < 0 else hi}, "
                                 f"outside [0, {num_nodes}) for a graph of {num_nodes} nodes")
    return edge_index


def check_parts(parts: Tensor, num_nodes: int, num_parts: int, *, allow_empty: bool = False) -> Tensor:
    """Return ``parts`` as CPU int64 ``[num_nodes]``, or raise a :class:`PartitionError`.

    Checks the shape, that ids lie in ``[0, num_parts)`` and (unless ``allow_empty``)
    that no part is empty: an empty rank would own nothing and stall collectives.
    """
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts <= 0:
        raise PartitionError(f"num_parts must be a positive int, got {num_parts!r}")
    if not isinstance(parts, Tensor) or parts.dim() != 1 or parts.numel() != num_nodes:
        shape = tuple(parts.shape) if isinstance(parts, Tensor) else type(parts).__name__
        raise PartitionError(f"part ids must be a [{num_nodes}] tensor (one per node), got {shape}")
    if parts.dtype.is_floating_point or parts.dtype == torch.bool:
        raise PartitionError(f"part ids must be integers, got dtype {parts.dtype}")
    parts = parts.to("cpu", torch.int64)
    if num_nodes > 0:
        lo, hi = int(parts.min()), int(parts.max())
        if lo < 0 or hi >= num_parts:
            raise PartitionError(f"part id {lo if lo < 0 else hi} outside [0, {num_parts})")
    if not allow_empty:
        sizes = torch.bincount(parts, minlength=num_parts)
        empty = (sizes == 0).nonzero().flatten()
        if empty.numel() > 0:
            raise PartitionError(f"partition {int(empty[0])} of {num_parts} is empty "
                                 f"({empty.numel()} empty in all); use fewer parts")
    return parts
