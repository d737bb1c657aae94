"""Contiguous partitioning: node id ranges split into near-equal chunks.

Cheap and deterministic; its quality depends entirely on the node numbering (good for
graphs already ordered by locality, like random for shuffled ids).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from commgnn.partition.base import PARTITIONERS, chunk_ids

if TYPE_CHECKING:
    from commgnn.partition.config import PartitionConfig


@PARTITIONERS.register("contiguous")
def contiguous_partition(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
    """``[num_nodes]`` int64 part ids, non-decreasing in node id, sizes differing by <= 1."""
    return chunk_ids(num_nodes, num_parts)
