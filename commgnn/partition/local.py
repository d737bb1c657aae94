"""What one rank holds of a partitioned graph.

Local numbering on rank ``r`` (``n_own`` owned nodes, ``n_halo`` halo nodes):

* rows ``0 .. n_own-1`` are the owned nodes, in ascending global id, unless
  ``partition.reorder`` is set: full-graph training then renumbers them once for locality
  (:mod:`commgnn.partition.reorder`) and ``global_ids`` is a permutation, not ascending
  (partition directories on disk are always ascending);
* rows ``n_own .. n_own+n_halo-1`` are the halo nodes (nodes of other partitions with
  an edge into an owned node), grouped by owner rank in ascending rank order and, within
  one owner, in ascending global id.

Because both sides order a peer's rows by global id, the owner's ``send_index`` block for
peer ``q`` lines up row for row with ``q``'s halo block for the owner: one
``all_to_all_single`` with ``send_counts`` / ``recv_counts`` as splits moves exactly the
halo rows, and nothing else (no ids are exchanged at run time). A reorder renumbers the
``send_index`` entries but keeps their order, so this alignment survives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(kw_only=True)
class LocalPartition:
    """Partition ``rank`` of ``num_parts``: owned nodes, halo plan and local topology."""

    rank: int
    """This partition's index in ``[0, num_parts)``."""
    num_parts: int
    """Number of partitions P (= world size)."""
    num_nodes_global: int
    """Node count of the whole graph."""
    num_classes: int
    """Number of label classes of the whole graph."""
    global_ids: Tensor
    """``[n_own]`` int64, global ids of the owned nodes (row ``i`` is node ``global_ids[i]``),
    ascending unless the rows were reordered (:func:`~commgnn.partition.reorder.reorder_partition`)."""
    halo_global_ids: Tensor
    """``[n_halo]`` int64, global ids of the halo nodes, ordered by (owner rank, global id)."""
    recv_counts: list[int]
    """``[P]``: halo rows received from each peer (entry ``rank`` is 0)."""
    send_index: Tensor
    """``[sum(send_counts)]`` int64, owned row indices to send, concatenated by destination
    peer in rank order; within a peer, ascending global id of the rows' nodes."""
    send_counts: list[int]
    """``[P]``: rows sent to each peer (entry ``rank`` is 0)."""
    edge_index: Tensor
    """``[2, E_r]`` int64 local edges, every global edge whose target is owned here.
    Row 0 = source in ``[0, n_own + n_halo)``, row 1 = target in ``[0, n_own)``;
    sorted by target, then source. No self loops are added."""
    in_degree: Tensor
    """``[n_own + n_halo]`` int64, in-degree in the *global* graph (no self loops added),
    for owned then halo rows (GCN normalisation needs the halo nodes' degrees)."""
    x: Tensor
    """``[n_own, F]`` float features of the owned nodes."""
    y: Tensor
    """``[n_own]`` int64 labels of the owned nodes."""
    train_mask: Tensor
    """``[n_own]`` bool."""
    val_mask: Tensor
    """``[n_own]`` bool."""
    test_mask: Tensor
    """``[n_own]`` bool."""

    @property
    def num_owned(self) -> int:
        return int(self.global_ids.numel())

    @property
    def num_halo(self) -> int:
        return int(self.halo_global_ids.numel())

    @property
    def num_edges(self) -> int:
        """``E_r``: the in-edges of the owned nodes."""
        return int(self.edge_index.shape[1])

    def in_csr(self) -> tuple[Tensor, Tensor]:
        """``(indptr [n_own + 1] int64, sources [E_r])``: the in-CSR over the owned rows with
        local source rows, in ``edge_index``'s order within a row (a view of its sources when
        it is sorted by target, as partitions are built; sorted here otherwise). A partition
        read from its folder returns the folder's arrays as they are."""
        src, dst = self.edge_index.cpu()
        if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
            order = torch.sort(dst, stable=True).indices
            src, dst = src[order], dst[order]
        indptr = torch.zeros(self.num_owned + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(dst, minlength=self.num_owned), 0, out=indptr[1:])
        return indptr, src

    def tensors(self) -> dict[str, Tensor]:
        """The tensor fields by name (for saving and for moving to a device)."""
        names = ("global_ids", "halo_global_ids", "send_index", "edge_index", "in_degree",
                 "x", "y", "train_mask", "val_mask", "test_mask")
        return {n: getattr(self, n) for n in names}

    def to(self, device: torch.device | str) -> "LocalPartition":
        """Copy of this partition with every tensor on ``device``."""
        moved = {n: t.to(device) for n, t in self.tensors().items()}
        return LocalPartition(rank=self.rank, num_parts=self.num_parts,
                              num_nodes_global=self.num_nodes_global, num_classes=self.num_classes,
                              recv_counts=list(self.recv_counts), send_counts=list(self.send_counts),
                              **moved)
