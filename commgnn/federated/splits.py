"""Split one graph into federated clients, build each client's local data, measure the split.

The graph is the data layer's PyG :class:`~torch_geometric.data.Data` (what
:func:`commgnn.data.load_dataset` returns): ``x`` ``[N, F]``, ``edge_index`` ``[2, E]``
(``edge_index[0]`` = source, ``[1]`` = target, PyG's message direction), ``y`` ``[N]``
(``-1`` = unlabelled) and 1-D bool ``train_mask`` / ``val_mask`` / ``test_mask`` (absent
masks count as all-False). An assignment ("owner") is a ``[N]`` int64 tensor of client
ids in ``0..K-1``, every client non-empty.

Methods of :func:`split_clients`:

* ``louvain``: :func:`networkx.community.louvain_communities` on the undirected graph,
  then communities dealt to clients as FederatedScope-GNN's Louvain splitter does:
  communities larger than ``ceil(N / K)`` are first cut into near-equal pieces (along a
  BFS order, so pieces stay connected where they can), then pieces go, largest first, to
  the client holding the fewest nodes. If there are still fewer pieces than clients, the
  largest piece is halved until there are enough. A client thus ends up with at most
  ``2 * ceil(N / K)`` nodes (the greedy's bound), usually close to ``N / K``.
* ``metis``: ``K``-way METIS through the project's wrapper
  (:func:`commgnn.partition.partition_graph` with ``method="metis"``).
* ``dirichlet``: label skew, the NIID-Bench recipe (Li et al., 2022) that OpenFGL and
  most FL papers use: per class, client shares ``p ~ Dir(alpha)``, with clients already
  holding ``N / K`` nodes given share 0; the class's nodes, shuffled, are cut at
  ``cumsum(p)``. Small ``alpha`` = strong skew. A draw is kept when every client holds at
  least ``min(10, N // K)`` nodes (the recipe redraws below 10); after
  :data:`DIRICHLET_TRIES` failed draws the draw with the largest smallest client is kept
  and nodes are moved, at random, from the largest clients into the small ones until
  each has that minimum. Unlabelled nodes (``y < 0``) go to uniformly random clients.
* ``file``: a user file mapping nodes to clients: ``.npy`` / ``.pt`` holding ``[N]``
  integer client ids, or ``.csv`` with one ``node,client`` row per node (a header row is
  allowed). Client ids must be ``0..K-1`` without gaps.

:func:`build_clients` turns an owner tensor into one :class:`ClientData` per client
(local features, labels, masks, induced edges and the cross-client edges into the
client); :func:`split_stats` measures the split (sizes, cut edges, label skew).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from commgnn.config import one_line, one_line_errors, positive
from commgnn.errors import ConfigError, DataError
from commgnn.federated.communities import louvain_communities

SplitMethod = Literal["louvain", "metis", "dirichlet", "file"]
"""How :func:`split_clients` assigns nodes to clients."""

FILE_SUFFIXES = (".npy", ".pt", ".csv")
"""Accepted extensions of a client map file."""

DIRICHLET_TRIES = 100
"""Draws of the Dirichlet split before falling back to moving nodes into small clients."""

_DIRICHLET_MIN = 10  # the recipe's minimum client size (capped at N // K on tiny graphs)


@dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """How to split the graph into federated clients (see :func:`split_clients`)."""

    method: SplitMethod = "louvain"
    """``louvain`` (communities, balanced), ``metis`` (min-cut), ``dirichlet`` (label
    skew with concentration ``alpha``) or ``file`` (a node -> client map at ``path``)."""
    clients: int = 4
    """Number of clients K (at least 2, at most the number of nodes)."""
    alpha: float = 0.5
    """Dirichlet concentration of the ``dirichlet`` method (> 0): small values (0.1)
    give each client few classes, large ones (100) near-IID clients. Ignored otherwise."""
    path: str | None = None
    """The client map file of the ``file`` method: ``.npy`` / ``.pt`` with ``[N]``
    client ids, or ``.csv`` with ``node,client`` rows. Only allowed with ``file``."""
    seed: int = 0
    """Seed of Louvain, METIS and the Dirichlet draws; the same seed gives the same split."""

    def __post_init__(self) -> None:
        if self.method not in get_args(SplitMethod):
            choices = ", ".join(repr(m) for m in get_args(SplitMethod))
            raise ConfigError(f"method: {self.method!r} is not one of {choices}")
        if isinstance(self.clients, bool) or not isinstance(self.clients, int) or self.clients < 2:
            raise ConfigError(f"clients must be an int >= 2, got {self.clients!r:.40}")
        positive("alpha", self.alpha)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {self.seed!r:.40}")
        if self.seed >= 2**63:  # METIS and torch take 64-bit seeds
            raise ConfigError(f"seed must be below 2**63, got {self.seed:.3e}")
        if self.method == "file":
            if not isinstance(self.path, str) or not self.path.strip():
                raise ConfigError("path: method 'file' needs path = a .npy, .pt or .csv file "
                                  "mapping each node to its client")
            if not self.path.lower().endswith(FILE_SUFFIXES):
                raise ConfigError(f"path must end in .npy, .pt or .csv, got {one_line(self.path)!r}")
        elif self.path is not None:
            raise ConfigError(f"path is only read with method = 'file' (method is "
                              f"{self.method!r}); remove path or set method = 'file'")


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


@one_line_errors
def split_clients(graph: Any, n_clients: int, method: SplitMethod, *, seed: int,
                  alpha: float = 0.5, path: str | None = None) -> Tensor:
    """``[N]`` int64 client ids in ``0..n_clients-1``, every client non-empty.

    ``graph`` is a PyG ``Data`` with ``edge_index`` (and ``y`` for ``dirichlet``); see the
    module docstring for the methods. Deterministic in ``seed``.

    Raises:
        ConfigError: unknown method, ``n_clients`` outside ``[1, N]``, ``alpha <= 0``,
            ``file`` without a path, or a file naming another number of clients.
        DataError: an unreadable or inconsistent client map file (one line each).
        PartitionError: METIS left a client empty.
    """
    n = _num_nodes(graph)
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise ConfigError(f"clients must be a positive int, got {n_clients!r:.40}")
    if n_clients > n:
        raise ConfigError(f"cannot split {n} nodes into {n_clients} clients; lower clients")
    edge_index = _edge_index(graph, n)
    if method == "louvain":
        owner = _louvain(edge_index, n, n_clients, seed)
    elif method == "metis":
        from commgnn.partition.api import partition_graph
        from commgnn.partition.config import PartitionConfig

        owner = partition_graph(edge_index, n, n_clients, PartitionConfig(method="metis", seed=seed))
    elif method == "dirichlet":
        positive("alpha", alpha)
        owner = _dirichlet(_labels(graph, n), n, n_clients, float(alpha), seed)
    elif method == "file":
        if path is None:
            raise ConfigError("method 'file' needs path = a .npy, .pt or .csv client map")
        owner = load_client_map(path, n, n_clients)
    else:
        choices = ", ".join(repr(m) for m in get_args(SplitMethod))
        raise ConfigError(f"split method {method!r} is not one of {choices}")
    sizes = torch.bincount(owner, minlength=n_clients)
    # Every method guarantees this; a violation is a bug here, not a user error.
    assert owner.shape == (n,) and sizes.numel() == n_clients and bool((sizes > 0).all())
    return owner


def split_from_config(graph: Any, cfg: SplitConfig) -> Tensor:
    """:func:`split_clients` with the settings of ``cfg``."""
    return split_clients(graph, cfg.clients, cfg.method, seed=cfg.seed, alpha=cfg.alpha,
                         path=cfg.path)


# --------------------------------------------------------------------------- louvain


def _louvain(edge_index: Tensor, n: int, k: int, seed: int) -> Tensor:
    graph = nx.Graph()
    graph.add_nodes_from(range(n))  # isolated nodes too: each is its own community
    src, dst = edge_index
    keep = src != dst
    graph.add_edges_from(zip(src[keep].tolist(), dst[keep].tolist()))
    communities = louvain_communities(graph, edge_index, n, seed)
    # FS-G caps communities near N / K before dealing them out: one giant community
    # would otherwise make one giant client.
    cap = math.ceil(n / k)
    pieces: list[list[int]] = []
    for community in communities:
        nodes = sorted(community)
        if len(nodes) <= cap:
            pieces.append(nodes)
        else:
            order = _bfs_order(graph, nodes)
            pieces.extend(chunk.tolist() for chunk in np.array_split(order, math.ceil(len(nodes) / cap)))
    while len(pieces) < k:  # fewer communities than clients: halve the largest
        largest = max(range(len(pieces)), key=lambda i: (len(pieces[i]), -pieces[i][0]))
        order = _bfs_order(graph, pieces.pop(largest))
        half = len(order) // 2
        pieces.extend([order[:half].tolist(), order[half:].tolist()])
    # Greedy (LPT): largest piece to the currently smallest client; ties by lowest id
    # (pieces by their smallest node), so the result depends on the seed alone.
    pieces.sort(key=lambda p: (-len(p), min(p)))
    heap = [(0, c) for c in range(k)]
    nodes_flat: list[int] = []
    clients_flat: list[int] = []
    for piece in pieces:
        size, c = heapq.heappop(heap)
        nodes_flat.extend(piece)
        clients_flat.extend([c] * len(piece))
        heapq.heappush(heap, (size + len(piece), c))
    owner = torch.empty(n, dtype=torch.int64)
    owner[torch.tensor(nodes_flat, dtype=torch.int64)] = torch.tensor(clients_flat, dtype=torch.int64)
    return owner


def _bfs_order(graph: nx.Graph, nodes: list[int]) -> np.ndarray:
    """``nodes`` in breadth-first order (component by component, each from its smallest
    node), so consecutive chunks of it are mostly connected."""
    sub = graph.subgraph(nodes)
    order: list[int] = []
    for component in sorted(nx.connected_components(sub), key=min):
        start = min(component)
        order.append(start)
        order.extend(v for _, v in nx.bfs_edges(sub, start))
    return np.asarray(order, dtype=np.int64)


# ------------------------------------------------------------------------- dirichlet


def _dirichlet(y: Tensor, n: int, k: int, alpha: float, seed: int) -> Tensor:
    rng = np.random.default_rng(seed)
    y_np = y.numpy()
    # Nodes grouped by class once (stable sort), so each draw only permutes the groups.
    by_class = np.argsort(y_np, kind="stable")
    classes, counts = np.unique(y_np, return_counts=True)
    groups = dict(zip(classes.tolist(), np.split(by_class, np.cumsum(counts)[:-1])))
    negative = [c for c in groups if c < 0]  # y < 0: unlabelled, no class to skew by
    unlabelled = np.concatenate([groups.pop(c) for c in negative]) if negative else None
    need = min(_DIRICHLET_MIN, n // k)
    best: np.ndarray | None = None
    best_min = -1
    for _ in range(DIRICHLET_TRIES):
        owner = _dirichlet_draw(groups, unlabelled, n, k, alpha, rng)
        smallest = int(np.bincount(owner, minlength=k).min())
        if smallest >= need:
            return torch.from_numpy(owner)
        if smallest > best_min:
            best, best_min = owner, smallest
    assert best is not None
    return torch.from_numpy(_fill_small(best, k, need, rng))


def _dirichlet_draw(groups: dict[int, np.ndarray], unlabelled: np.ndarray | None, n: int,
                    k: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    owner = np.empty(n, dtype=np.int64)
    sizes = np.zeros(k, dtype=np.int64)
    for idx in groups.values():
        idx = rng.permutation(idx)
        p = rng.dirichlet(np.full(k, alpha))
        p[sizes >= n / k] = 0.0  # the recipe's balance term: full clients take no more
        total = p.sum()
        if not np.isfinite(total) or total <= 0:  # all mass on full clients (tiny alpha)
            p = (sizes < n / k).astype(np.float64)
            total = p.sum()
        cuts = np.clip((np.cumsum(p / total) * idx.size).astype(np.int64)[:-1], 0, idx.size)
        take = np.diff(np.concatenate([[0], cuts, [idx.size]]))
        owner[idx] = np.repeat(np.arange(k), take)
        sizes += take
    if unlabelled is not None and unlabelled.size:
        owner[unlabelled] = rng.integers(k, size=unlabelled.size)
    return owner


def _fill_small(owner: np.ndarray, k: int, need: int, rng: np.random.Generator) -> np.ndarray:
    """Move random nodes from the largest clients into those below ``need`` nodes."""
    owner = owner.copy()
    sizes = np.bincount(owner, minlength=k)
    for c in np.flatnonzero(sizes < need).tolist():
        while sizes[c] < need:
            donor = int(np.argmax(sizes))
            moved = min(need - int(sizes[c]), int(sizes[donor]) - need)
            pick = rng.choice(np.flatnonzero(owner == donor), size=moved, replace=False)
            owner[pick] = c
            sizes[donor] -= moved
            sizes[c] += moved
    return owner


# ------------------------------------------------------------------------------ file


@one_line_errors
def load_client_map(path: str | Path, num_nodes: int, n_clients: int) -> Tensor:
    """``[num_nodes]`` int64 client ids read from a ``.npy`` / ``.pt`` / ``.csv`` file.

    Raises:
        DataError: missing or unreadable file, wrong length, a node mapped to no client
            (missing from a CSV, or a negative / NaN id), non-integer ids, ids with gaps.
        ConfigError: unknown extension, or the file names another number of clients.
    """
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(f"client map {file} must end in .npy, .pt or .csv")
    if not file.is_file():
        raise DataError(f"client map file not found: {file}")
    where = f"client map {file}"
    try:
        if suffix == ".npy":
            values = torch.from_numpy(np.array(np.load(file, allow_pickle=False)))
        elif suffix == ".pt":
            values = torch.load(file, map_location="cpu", weights_only=True)
        else:
            values = _read_csv(file, num_nodes, where)
    except DataError:
        raise
    except Exception as exc:  # corrupt file, foreign pickle, bad CSV cell: one line
        text = " ".join(str(exc).split())[:200]
        raise DataError(f"cannot read {where}: {type(exc).__name__}: {text}") from exc
    if not isinstance(values, Tensor):
        raise DataError(f"{where} must hold a tensor of client ids, got {type(values).__name__}")
    return _check_owner(values, num_nodes, n_clients, where)


def _read_csv(file: Path, num_nodes: int, where: str) -> Tensor:
    """``node,client`` rows (optional header) -> ``[num_nodes]`` ids, ``-1`` for missing nodes."""
    with file.open("r", encoding="utf-8") as f:
        first = f.readline()
    header = int(bool(first.strip()) and not first.split(",")[0].strip().lstrip("-").isdigit())
    # numpy's C parser: no per-row Python loop even for millions of rows.
    try:
        rows = np.loadtxt(file, delimiter=",", dtype=np.float64, skiprows=header, ndmin=2)
    except ValueError:
        # An empty or non-numeric cell: the slower parser reads it as NaN, so the checks
        # below can name the node (or row) instead of quoting numpy's parse error.
        rows = np.atleast_2d(np.genfromtxt(file, delimiter=",", dtype=np.float64,
                                           skip_header=header))
    if rows.shape[0] == 0:
        raise DataError(f"{where} has no node,client rows")
    if rows.shape[1] != 2:
        raise DataError(f"{where} must have 2 columns (node,client), got {rows.shape[1]}")
    nodes = rows[:, 0]
    if not np.all(np.isfinite(nodes) & (nodes == np.round(nodes))):
        bad = int(np.flatnonzero(~(np.isfinite(nodes) & (nodes == np.round(nodes))))[0])
        raise DataError(f"{where}: row {bad + 1 + header} has node id {nodes[bad]!r}, not an integer")
    nodes = nodes.astype(np.int64)
    out = (nodes < 0) | (nodes >= num_nodes)
    if out.any():
        bad = int(np.flatnonzero(out)[0])
        raise DataError(f"{where}: row {bad + 1 + header} names node {nodes[bad]}, outside "
                        f"0..{num_nodes - 1} for a graph of {num_nodes} nodes")
    counts = np.bincount(nodes, minlength=num_nodes)
    if (counts > 1).any():
        dup = int(np.flatnonzero(counts > 1)[0])
        raise DataError(f"{where}: node {dup} appears in {counts[dup]} rows; give one client per node")
    values = torch.full((num_nodes,), float("nan"), dtype=torch.float64)
    values[torch.from_numpy(nodes)] = torch.from_numpy(rows[:, 1].copy())
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise DataError(f"{where}: node {int(missing[0])} is mapped to no client (no row for it; "
                        f"{missing.size} nodes missing); list every node 0..{num_nodes - 1}")
    return values


def _check_owner(values: Tensor, n: int, k: int, where: str) -> Tensor:
    if values.dim() != 1:
        raise DataError(f"{where} must be 1-D (one client id per node), got shape {list(values.shape)}")
    if values.numel() != n:
        raise DataError(f"{where} maps {values.numel()} nodes but the graph has {n}")
    if values.dtype == torch.bool or values.is_complex():
        raise DataError(f"{where} must hold integer client ids, got dtype {values.dtype}")
    if values.dtype.is_floating_point:
        nan = torch.isnan(values)
        if nan.any():
            node = int(nan.nonzero()[0])
            raise DataError(f"{where}: node {node} is mapped to no client (empty, NaN or "
                            f"non-numeric id); every node needs a client id in 0..{k - 1}")
        frac = values != torch.round(values)
        if frac.any():
            node = int(frac.nonzero()[0])
            raise DataError(f"{where}: node {node} has client id {float(values[node])}, "
                            f"not an integer")
    owner = values.to(torch.int64)
    negative = owner < 0
    if negative.any():
        node = int(negative.nonzero()[0])
        raise DataError(f"{where}: node {node} is mapped to no client (id {int(owner[node])}); "
                        f"every node needs a client id in 0..{k - 1}")
    ids = torch.unique(owner)
    m = int(ids[-1]) + 1
    if ids.numel() != m:
        gap = int((torch.isin(torch.arange(m), ids, invert=True)).nonzero()[0])
        raise DataError(f"{where}: client ids must run 0..{m - 1} without gaps, but no node "
                        f"has client {gap}")
    if m != k:
        raise ConfigError(f"{where} names {m} clients but clients = {k}; set clients = {m} "
                          f"or fix the file")
    return owner


# ------------------------------------------------------------------- client data


def build_clients(graph: Any, owner: Tensor) -> list[ClientData]:
    """One :class:`ClientData` per client id ``0..owner.max()``, in client order.

    Whole-tensor work (a stable sort of nodes and of edges by client, gathers); the only
    Python loop runs over the clients to slice out their blocks. Slices are cloned so a
    client's tensors do not keep the full graph's storage alive.
    """
    n = _num_nodes(graph)
    owner = _check_assignment(owner, n)
    k = int(owner.max()) + 1
    x = getattr(graph, "x", None)
    if x is None or x.size(0) != n:
        raise DataError(f"graph needs node features x with {n} rows to build clients")
    y = _labels(graph, n)
    masks = [_mask(graph, name, n) for name in ("train_mask", "val_mask", "test_mask")]
    edge_index = _edge_index(graph, n)
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
    n = _num_nodes(graph)
    owner = _check_assignment(owner, n)
    k = int(owner.max()) + 1
    src, dst = _edge_index(graph, n)
    src_owner, dst_owner = owner[src], owner[dst]
    same = src_owner == dst_owner
    local_edges = torch.bincount(dst_owner[same], minlength=k)
    cross_in = torch.bincount(dst_owner[~same], minlength=k)
    sizes = torch.bincount(owner, minlength=k)
    per_mask = {name: torch.bincount(owner[_mask(graph, f"{name}_mask", n)], minlength=k)
                for name in ("train", "val", "test")}
    y = _labels(graph, n)
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


# ----------------------------------------------------------------------- helpers


def _num_nodes(graph: Any) -> int:
    n = getattr(graph, "num_nodes", None)
    if n is None:
        raise DataError("graph has no nodes (num_nodes is unset)")
    return int(n)


def _edge_index(graph: Any, n: int) -> Tensor:
    edge_index = getattr(graph, "edge_index", None)
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise DataError("graph needs an edge_index of shape [2, E]")
    edge_index = edge_index.to("cpu", torch.int64)
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise DataError(f"graph's edge_index refers to nodes outside 0..{n - 1}")
    return edge_index


def _labels(graph: Any, n: int) -> Tensor:
    y = getattr(graph, "y", None)
    if not isinstance(y, Tensor) or y.dim() != 1 or y.numel() != n:
        raise DataError(f"graph needs labels y of shape [{n}]")
    return y.to("cpu", torch.int64)


def _mask(graph: Any, name: str, n: int) -> Tensor:
    mask = getattr(graph, name, None)
    if mask is None:  # as in partition.build: an absent mask selects nothing
        return torch.zeros(n, dtype=torch.bool)
    return mask.to("cpu", torch.bool)


def _check_assignment(owner: Tensor, n: int) -> Tensor:
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
