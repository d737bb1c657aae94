"""Balanced random partitioning: a baseline with no locality at all.

A seeded random permutation of the nodes is cut into ``num_parts`` near-equal chunks,
so part sizes differ by at most one node and the same seed gives the same partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from commgnn.partition.base import PARTITIONERS, chunk_ids

if TYPE_CHECKING:
    from commgnn.partition.config import PartitionConfig


@PARTITIONERS.register("random")
def random_partition(edge_index: Tensor, num_nodes: int, num_parts: int, cfg: PartitionConfig) -> Tensor:
    """``[num_nodes]`` int64 part ids: node ``perm[i]`` goes to chunk ``i``'s part."""
    # A private generator: the result must not depend on (or disturb) the global RNG.
    gen = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(num_nodes, generator=gen)
    parts = torch.empty(num_nodes, dtype=torch.int64)
    parts[perm] = chunk_ids(num_nodes, num_parts)
    return parts
