"""Layer 2: split a graph into one partition per rank, build each rank's local view,
measure the split, and save/load partition directories.

Typical use::

    parts = assign_parts(data.edge_index, data.num_nodes, P, PartitionConfig(method="metis"))
    report = partition_report(data.edge_index, parts, P, data.train_mask)
    locals_ = build_local_partitions(data, parts, P)
    save_partitions("parts/", locals_, {"graph_fingerprint": fp, "report": report, ...})
    lp = load_partition("parts/", rank, expected_fingerprint=fp, expected_parts=P)
"""

import warnings
from typing import Any

# the strategies first: importing them fills PARTITIONERS (commgnn.partition.config checks
# `method` against it)
from commgnn.partition import contiguous as _contiguous  # noqa: F401  (registers "contiguous")
from commgnn.partition import ldg as _ldg  # noqa: F401  (registers "ldg")
from commgnn.partition import metis as _metis  # noqa: F401  (registers "metis")
from commgnn.partition import random as _random  # noqa: F401  (registers "random")
from commgnn.partition.api import assign_parts
from commgnn.partition.base import PARTITIONERS
from commgnn.partition.build import build_local_partition, build_local_partitions
from commgnn.partition.config import PartitionConfig
from commgnn.partition.local import LocalPartition
from commgnn.partition.report import PartitionReport, format_report, partition_report
from commgnn.partition.store import (load_meta, load_partition, partition_from_bytes, partition_to_bytes,
                                     save_partitions)

__all__ = [
    "PARTITIONERS",
    "assign_parts",
    "LocalPartition",
    "PartitionConfig",
    "PartitionReport",
    "build_local_partition",
    "build_local_partitions",
    "format_report",
    "load_meta",
    "load_partition",
    "partition_from_bytes",
    "partition_report",
    "partition_to_bytes",
    "save_partitions",
]


def __getattr__(name: str) -> Any:
    """``partition_graph``: the deprecated name of :func:`assign_parts` (for one release; the
    verb that partitions a graph and saves its directory is :func:`commgnn.api.partition_graph`)."""
    if name == "partition_graph":
        warnings.warn("commgnn.partition.partition_graph is deprecated: use commgnn.partition.assign_parts "
                      "(commgnn.partition_graph is the verb that saves a partition directory)",
                      DeprecationWarning, stacklevel=2)
        return assign_parts
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
