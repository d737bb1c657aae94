"""Each client's share of a split graph (:class:`ClientData`, :func:`build_clients`) and
what the split looks like (:func:`split_stats`).

The graph is the data layer's PyG :class:`~torch_geometric.data.Data` (what
:func:`commgnn.data.load_dataset` returns): ``x`` ``[N, F]``, ``edge_index`` ``[2, E]``
(``edge_index[0]`` = source, ``[1]`` = target, PyG's message direction), ``y`` ``[N]``
(``-1`` = unlabelled) and 1-D bool ``train_mask`` / ``val_mask`` / ``test_mask`` (absent
masks count as all-False). An assignment ("owner") is a ``[N]`` int64 tensor of client
ids in ``0..K-1``, every client non-empty.

:func:`build_clients` turns an owner tensor into one :class:`ClientData` per client
(local features, labels, masks, induced edges and the cross-client edges into the
client); :func:`split_stats` measures the split (sizes, cut edges, label skew).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from commgnn.errors import DataError


@dataclass(frozen=True, kw_only=True, eq=False)
class ClientData:
    """One client's share of the graph. ``n_c`` nodes, ``E_c`` local edges, ``X`` cross edges.

    Local node ``i`` is global node ``nodes[i]``; ``nodes`` is ascending.
    """

    client: int
    """This client's id."""
    nodes: Tensor
    """``[n_c]`` int64 global ids of the client's nodes, ascending."""
    x: Tensor
    """``[n_c, F]`` features of those nodes."""
    y: Tensor
    """``[n_c]`` int64 labels (``-1`` = unlabelled)."""
    train_mask: Tensor
    """``[n_c]`` bool."""
    val_mask: Tensor
    """``[n_c]`` bool."""
    test_mask: Tensor
    """``[n_c]`` bool."""
    edge_index: Tensor
    """``[2, E_c]`` int64 local ids: the edges with both ends in this client, in the
    graph's edge order (what ``torch_geometric.utils.subgraph(nodes, ...,
    relabel_nodes=True)`` returns)."""
    cross_edges: Tensor
    """``[2, X]`` int64: edges from other clients' nodes into this client's nodes, row 0
    the source's global id, row 1 the target's local id; graph edge order. With both
    directions stored (undirected graphs) every cut edge is in both clients' lists."""
    cross_src_client: Tensor
    """``[X]`` int64: the client owning each cross edge's source."""
    cross_src_local: Tensor
    """``[X]`` int64: each cross edge's source as a local id of its own client, i.e.
    ``clients[cross_src_client[j]].nodes[cross_src_local[j]] == cross_edges[0, j]``:
    the row to read from that client's embeddings."""

    @property
    def num_nodes(self) -> int:
        """``n_c``."""
        return int(self.nodes.numel())

    @property
    def num_cross(self) -> int:
        """``X``, the number of edges arriving from other clients."""
        return int(self.cross_edges.size(1))


def build_clients(graph: Any, owner: Tensor) -> list[ClientData]:
    """One :class:`ClientData` per client id ``0..owner.max()``, in client order.

    Whole-tensor work (a stable sort of nodes and of edges by client, gathers); the only
    Python loop runs over the clients to slice out their blocks. Slices are cloned so a
    client's tensors do not keep the full graph's storage alive.
    """
    n = graph_num_nodes(graph)
    owner = check_assignment(owner, n)
    k = int(owner.max()) + 1
    x = getattr(graph, "x", None)
    if x is None or x.size(0) != n:
        raise DataError(f"graph needs node features x with {n} rows to build clients")
    y = graph_labels(graph, n)
    masks = [graph_mask(graph, name, n) for name in ("train_mask", "val_mask", "test_mask")]
    edge_index = graph_edge_index(graph, n)
    counts = torch.bincount(owner, minlength=k)
    order = torch.argsort(owner, stable=True)  # client by client, ascending id within
    starts = torch.cumsum(counts, 0) - counts
    local = torch.empty(n, dtype=torch.int64)
    local[order] = torch.arange(n) - torch.repeat_interleave(starts, counts)
    src, dst = edge_index
    src_owner, dst_owner = owner[src], owner[dst]
    # Edges grouped by the target's client, graph order kept within a group: an edge
    # belongs to (is local to, or crosses into) the client of its target.
    edge_order = torch.argsort(dst_owner, stable=True)
    edge_counts = torch.bincount(dst_owner, minlength=k)
    node_groups = order.split(counts.tolist())
    edge_groups = edge_order.split(edge_counts.tolist())
    clients = []
    for c in range(k):
        nodes, eids = node_groups[c], edge_groups[c]
        inside = src_owner[eids] == c
        own, cross = eids[inside], eids[~inside]
        clients.append(ClientData(
            client=c, nodes=nodes.clone(), x=x[nodes], y=y[nodes],
            train_mask=masks[0][nodes], val_mask=masks[1][nodes], test_mask=masks[2][nodes],
            edge_index=torch.stack([local[src[own]], local[dst[own]]]),
            cross_edges=torch.stack([src[cross], local[dst[cross]]]),
            cross_src_client=src_owner[cross], cross_src_local=local[src[cross]]))
    return clients


def split_stats(graph: Any, owner: Tensor) -> dict[str, Any]:
    """Measures of a split, as plain values (JSON-ready).

    Keys: ``clients``, ``nodes``, ``edges``; ``per_client``: one dict per client with
    ``client``, ``nodes``, ``local_edges`` (both ends in the client), ``cross_in_edges``
    (arriving from other clients), ``train`` / ``val`` / ``test`` node counts and
    ``label_tv``; ``cross_edge_fraction``: share of the graph's (directed) edges whose
    ends are in different clients, i.e. lost if cross-client edges are dropped;
    ``node_balance``: largest client / mean client size; ``label_tv_mean`` /
    ``label_tv_max``: total-variation distance ``0.5 * sum_c |p_client(c) - p_global(c)|``
    between a client's label histogram (its labelled nodes) and the whole graph's,
    averaged / maximised over the clients that have labelled nodes (a client without
    any has ``label_tv`` None).
    """
    n = graph_num_nodes(graph)
    owner = check_assignment(owner, n)
    k = int(owner.max()) + 1
    src, dst = graph_edge_index(graph, n)
    src_owner, dst_owner = owner[src], owner[dst]
    same = src_owner == dst_owner
    local_edges = torch.bincount(dst_owner[same], minlength=k)
    cross_in = torch.bincount(dst_owner[~same], minlength=k)
    sizes = torch.bincount(owner, minlength=k)
    per_mask = {name: torch.bincount(owner[graph_mask(graph, f"{name}_mask", n)], minlength=k)
                for name in ("train", "val", "test")}
    y = graph_labels(graph, n)
    labelled = y >= 0
    tv: list[float | None] = [None] * k
    if labelled.any():
        num_classes = int(y[labelled].max()) + 1
        hist = torch.bincount(owner[labelled] * num_classes + y[labelled],
                              minlength=k * num_classes).view(k, num_classes).double()
        glob = hist.sum(0) / hist.sum()
        rows = hist.sum(1)
        dist = 0.5 * (hist / rows.clamp(min=1).unsqueeze(1) - glob).abs().sum(1)
        tv = [float(d) if r > 0 else None for d, r in zip(dist.tolist(), rows.tolist())]
    known = [t for t in tv if t is not None]
    e = int(src.numel())
    return {
        "clients": k,
        "nodes": n,
        "edges": e,
        "per_client": [
            {"client": c, "nodes": int(sizes[c]), "local_edges": int(local_edges[c]),
             "cross_in_edges": int(cross_in[c]), "train": int(per_mask["train"][c]),
             "val": int(per_mask["val"][c]), "test": int(per_mask["test"][c]),
             "label_tv": tv[c]}
            for c in range(k)],
        "cross_edge_fraction": float((~same).sum()) / e if e else 0.0,
        "node_balance": float(sizes.max()) / (n / k),
        "label_tv_mean": sum(known) / len(known) if known else None,
        "label_tv_max": max(known) if known else None,
    }


# ---------------------------------------------------------------- reading the graph's fields


def graph_num_nodes(graph: Any) -> int:
    """``graph.num_nodes`` (a :class:`~commgnn.errors.DataError` when unset)."""
    n = getattr(graph, "num_nodes", None)
    if n is None:
        raise DataError("graph has no nodes (num_nodes is unset)")
    return int(n)


def graph_edge_index(graph: Any, n: int) -> Tensor:
    """``graph.edge_index`` as CPU int64 ``[2, E]``, checked against ``n`` nodes."""
    edge_index = getattr(graph, "edge_index", None)
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise DataError("graph needs an edge_index of shape [2, E]")
    edge_index = edge_index.to("cpu", torch.int64)
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise DataError(f"graph's edge_index refers to nodes outside 0..{n - 1}")
    return edge_index


def graph_labels(graph: Any, n: int) -> Tensor:
    """``graph.y`` as CPU int64 ``[n]``."""
    y = getattr(graph, "y", None)
    if not isinstance(y, Tensor) or y.dim() != 1 or y.numel() != n:
        raise DataError(f"graph needs labels y of shape [{n}]")
    return y.to("cpu", torch.int64)


def graph_mask(graph: Any, name: str, n: int) -> Tensor:
    """The bool mask ``graph.<name>`` on the CPU (all False when absent)."""
    mask = getattr(graph, name, None)
    if mask is None:  # as in partition.build: an absent mask selects nothing
        return torch.zeros(n, dtype=torch.bool)
    return mask.to("cpu", torch.bool)


def check_assignment(owner: Tensor, n: int) -> Tensor:
    """``owner`` as CPU int64 ``[n]`` with ids ``0..K-1``, none empty (else ValueError:
    owners come from :func:`split_clients`, so a bad one is a caller bug)."""
    if not isinstance(owner, Tensor) or owner.shape != (n,):
        shape = list(owner.shape) if isinstance(owner, Tensor) else type(owner).__name__
        raise ValueError(f"owner must be a [{n}] tensor of client ids, got {shape}")
    if owner.dtype.is_floating_point or owner.dtype == torch.bool:
        raise ValueError(f"owner must hold integer client ids, got {owner.dtype}")
    owner = owner.to("cpu", torch.int64)
    if n == 0 or int(owner.min()) < 0:
        raise ValueError("owner must map every node to a client id >= 0")
    sizes = torch.bincount(owner)
    if bool((sizes == 0).any()):
        raise ValueError(f"client {int((sizes == 0).nonzero()[0])} has no nodes")
    return owner
