"""Layer 2: split a graph into one partition per rank, build each rank's local view,
measure the split, and save/load partition directories.

Typical use::

    parts = partition_graph(data.edge_index, data.num_nodes, P, PartitionConfig(method="metis"))
    report = partition_report(data.edge_index, parts, P, data.train_mask)
    locals_ = build_local_partitions(data, parts, P)
    save_partitions("parts/", locals_, {"graph_fingerprint": fp, "report": report, ...})
    lp = load_partition("parts/", rank, expected_fingerprint=fp, expected_parts=P)
"""

# the strategies first: importing them fills PARTITIONERS (commgnn.partition.config checks
# `method` against it)
from commgnn.partition import contiguous as _contiguous  # noqa: F401  (registers "contiguous")
from commgnn.partition import ldg as _ldg  # noqa: F401  (registers "ldg")
from commgnn.partition import metis as _metis  # noqa: F401  (registers "metis")
from commgnn.partition import random as _random  # noqa: F401  (registers "random")
from commgnn.partition.api import partition_graph
from commgnn.partition.base import PARTITIONERS
from commgnn.partition.build import build_local_partition, build_local_partitions
from commgnn.partition.config import PartitionConfig
from commgnn.partition.local import LocalPartition
from commgnn.partition.report import PartitionReport, format_report, partition_report
from commgnn.partition.store import (load_meta, load_partition, partition_from_bytes, partition_to_bytes,
                                     save_partitions)

__all__ = [
    "PARTITIONERS",
    "LocalPartition",
    "PartitionConfig",
    "PartitionReport",
    "build_local_partition",
    "build_local_partitions",
    "format_report",
    "load_meta",
    "load_partition",
    "partition_from_bytes",
    "partition_graph",
    "partition_report",
    "partition_to_bytes",
    "save_partitions",
]
