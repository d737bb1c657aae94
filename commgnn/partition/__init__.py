"""Layer 2: split a graph into one partition per rank, build each rank's local view,
measure the split, and save/load partition directories.

Typical use::

    parts = assign_parts(data.edge_index, data.num_nodes, P, PartitionConfig(method="metis"))
    report = partition_report(data.edge_index, parts, P, data.train_mask)
    locals_ = build_local_partitions(data, parts, P)
    save_partitions("parts/", locals_, {"graph_fingerprint": fp, "report": report, ...})
    lp = load_partition("parts/", rank, expected_fingerprint=fp, expected_parts=P)

A graph folder that does not fit in memory (:mod:`commgnn.data.ondisk`) is partitioned out
of core into one folder per rank, which ``load_partition`` reads the same way::

    report = partition_graph_folder(open_graph_folder("graph/"), P, PartitionConfig(method="lp-metis"), "parts/")
"""

import warnings
from typing import Any

# the strategies first: importing them fills PARTITIONERS (commgnn.partition.config checks
# `method` against it)
from commgnn.partition import contiguous as _contiguous  # noqa: F401  (registers "contiguous")
from commgnn.partition import ldg as _ldg  # noqa: F401  (registers "ldg")
from commgnn.partition import lp_metis as _lp_metis  # noqa: F401  (registers "lp-metis")
from commgnn.partition import metis as _metis  # noqa: F401  (registers "metis")
from commgnn.partition import random as _random  # noqa: F401  (registers "random")
from commgnn.partition.api import assign_parts
from commgnn.partition.base import PARTITIONERS
from commgnn.partition.build import build_local_partition, build_local_partitions
from commgnn.partition.config import PartitionConfig
from commgnn.partition.disk_csr import SymmetricCSR, build_symmetric_csr
from commgnn.partition.folders import folder_fingerprint, load_rank_folder, write_partition_folders
from commgnn.partition.local import LocalPartition
from commgnn.partition.report import PartitionReport, format_report, partition_report
from commgnn.partition.lp_metis import lp_metis_csr
from commgnn.partition.ooc import folder_parts, partition_graph_folder
from commgnn.partition.store import (load_meta, load_partition, partition_from_bytes, partition_to_bytes,
                                     save_partitions)

__all__ = [
    "PARTITIONERS",
    "assign_parts",
    "LocalPartition",
    "PartitionConfig",
    "PartitionReport",
    "SymmetricCSR",
    "build_symmetric_csr",
    "folder_fingerprint",
    "folder_parts",
    "load_rank_folder",
    "lp_metis_csr",
    "partition_graph_folder",
    "write_partition_folders",
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
